"""The store's tables. A stored response keeps what the Responses API returns of it (its `Response` object
and its input items, each with an id), and the conversation it ends, as chat messages: what a
`previous_response_id` continues from, read in one row."""

from typing import Any

from sqlalchemy import JSON, BigInteger, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class StoreBase(DeclarativeBase):
    """Choir's tables, in a metadata of their own."""


class StoredResponse(StoreBase):
    __tablename__ = "choir_response"

    id: Mapped[str] = mapped_column(String(300), primary_key=True)  # resp_ + a request id (256 at most)
    owner: Mapped[str] = mapped_column(String(64), index=True)  # a digest of the API key that made it ("" open)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, index=True, nullable=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # the Response object, as returned
    input_items: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # this turn's input items, with ids
    conversation: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # chat messages through this response
