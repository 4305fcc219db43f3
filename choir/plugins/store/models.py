"""The store's tables (their history is choir/plugins/store/migrations/, run at start-up).

A stored response keeps its own turn only: its `Response` object (the output items among it) and its input
items, each with an id, plus a link to the response it continued. A `previous_response_id` continues the
chain those links make, read in one recursive query: storage grows with the turns, not with their square.
A background response also keeps its stream's events, so any API process can replay or follow it.
A conversation is a list of items in the order they were added. A file is its bytes and what OpenAI says of it."""

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID = String(300)  # resp_ + a request id (256 at most)
# The order items were added in: an integer key SQLite assigns as its rowid, a sequence on PostgreSQL.
Sequence = BigInteger().with_variant(Integer(), "sqlite")


class StoreBase(DeclarativeBase):
    """Choir's tables, in a metadata of their own."""


class StoredResponse(StoreBase):
    __tablename__ = "choir_response"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)  # a digest of the API key that made it ("" open)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, index=True, nullable=True)
    status: Mapped[str] = mapped_column(String(16))  # the Response's: queued, in_progress, completed, cancelled…
    background: Mapped[bool] = mapped_column(Boolean, default=False)
    previous_id: Mapped[str | None] = mapped_column(ID, nullable=True)  # the response this one continued
    # When the process making a background response last said it is still at work (a stale one is reaped).
    heartbeat_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # the Response object, as returned
    input_items: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # this turn's input items, with ids


class StoredEvent(StoreBase):
    """A background response's stream, event by event (`sequence` is the event's `sequence_number`)."""

    __tablename__ = "choir_response_event"

    response_id: Mapped[str] = mapped_column(ID, primary_key=True)
    sequence: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(80))  # the event's type, its SSE name
    data: Mapped[str] = mapped_column(Text)  # the event's JSON


class StoredConversation(StoreBase):
    __tablename__ = "choir_conversation"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, index=True, nullable=True)
    meta: Mapped[dict[str, str]] = mapped_column("metadata", JSON)


class ConversationItem(StoreBase):
    __tablename__ = "choir_conversation_item"
    # An item's id is the client's (input items may carry theirs), so it is unique within its conversation only.
    __table_args__ = (UniqueConstraint("conversation_id", "id", name="uq_choir_conversation_item"),)

    position: Mapped[int] = mapped_column(Sequence, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(ID)
    conversation_id: Mapped[str] = mapped_column(String(80), index=True)
    item: Mapped[dict[str, Any]] = mapped_column(JSON)  # as the Conversations API lists it


class StoredFile(StoreBase):
    """An uploaded file (the Batch API's input, and the output and error files a batch writes)."""

    __tablename__ = "choir_file"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, index=True, nullable=True)
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    size: Mapped[int] = mapped_column("bytes", BigInteger)
    content: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)  # read only by /content


class StoredBatch(StoreBase):
    """A batch (OpenAI's Batch API): its Batch object, and which process runs it (claimed in the store)."""

    __tablename__ = "choir_batch"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), index=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # the Batch object, as returned
    runner: Mapped[str | None] = mapped_column(String(80), nullable=True)  # the process running it
    heartbeat_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # when that process last said so


class BatchLine(StoreBase):
    """One answered line of a batch (its output or error line): a line answered is never run again."""

    __tablename__ = "choir_batch_line"

    batch_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    line: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ok: Mapped[bool] = mapped_column(Boolean)  # in the output file (else in the error file)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)  # the line as the output or error file has it
