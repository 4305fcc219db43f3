"""Stored responses: save one when it ends, read it back (its owner's only), delete it, page its input
items. A response another key made, or one past its time to live, is not there (a 404 to the caller)."""

import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from advanced_alchemy.exceptions import RepositoryError
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from sqlalchemy import delete
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.errors import APIError
from plugins.store.models import StoredResponse

log = structlog.get_logger("choir.store")
EVICT_EVERY_SECONDS = 60


class StoreUnavailable(APIError):
    def __init__(self) -> None:
        super().__init__(503, "The response store is unavailable: stored responses cannot be saved or read now. "
                              "Requests with `store: false` and no previous_response_id are served as usual.")


@asynccontextmanager
async def _reachable() -> AsyncIterator[None]:
    """A database that is down or unreachable is a 503 for the stateful call, not a 500."""
    try:
        yield
    except (SQLAlchemyError, RepositoryError, OSError) as exc:
        log.warning("response store unavailable", error=str(exc).split("\n")[0])
        raise StoreUnavailable() from None


class ResponseRepository(SQLAlchemyAsyncRepository[StoredResponse]):
    model_type = StoredResponse


def owner_of(key: bytes | None) -> str:
    """Who a stored object belongs to: a digest of the API key (never the key), "" on an open server."""
    return hashlib.sha256(key).hexdigest() if key else ""


@dataclass(frozen=True)
class ItemPage:
    items: list[dict[str, Any]]
    has_more: bool


class ResponseStore:
    """`prepare` makes the tables: run before the first use, and again after a failure, so a database that is
    down at start-up (or starts later) costs the stateful calls a 503 meanwhile, never the server its start."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], ttl: int | None, keyed: bool = False,
                 prepare: Callable[[], Awaitable[None]] | None = None) -> None:
        self.sessions, self.ttl, self.keyed, self._prepare = sessions, ttl, keyed, prepare
        self._evicted = 0.0

    def owner(self, authorization: bytes | None) -> str:
        """Who a request stores for and reads as: its API key's digest when the server has keys (each key
        sees only its own), else "" (an open server: everyone alike)."""
        if not self.keyed or not authorization:
            return ""
        return owner_of(authorization.split(b" ", 1)[-1].strip())

    async def ready(self) -> None:
        if self._prepare is not None:
            async with _reachable():
                await self._prepare()
            self._prepare = None

    async def check_free(self, response_id: str) -> None:
        """Before any work for a response to be stored: its id must be free (a client may reuse a request id),
        and the store reachable (a 503 now, not after the generation)."""
        await self.ready()
        async with _reachable(), self.sessions() as session:
            taken = await ResponseRepository(session=session).exists(id=response_id)
        if taken:
            raise APIError(409, f"A response with id '{response_id}' is stored already: send another request id "
                                "(X-Request-Id or `request_id`), or `store: false`.", "request_id")

    async def save(self, owner: str, body: dict[str, Any], input_items: list[dict[str, Any]],
                   conversation: list[dict[str, Any]]) -> None:
        await self.ready()
        now = int(time.time())
        row = StoredResponse(id=body["id"], owner=owner, created_at=now,
                             expires_at=now + self.ttl if self.ttl else None, body=body, input_items=input_items,
                             conversation=conversation)
        async with _reachable(), self.sessions() as session:
            await ResponseRepository(session=session).add(row, auto_commit=True)
        if self.ttl and now - self._evicted > EVICT_EVERY_SECONDS:
            await self.evict()

    async def get(self, owner: str, response_id: str) -> StoredResponse | None:
        await self.ready()
        async with _reachable(), self.sessions() as session:
            row = await ResponseRepository(session=session).get_one_or_none(id=response_id, owner=owner)
        if row is None or (row.expires_at is not None and row.expires_at <= time.time()):
            return None
        return row

    async def delete(self, owner: str, response_id: str) -> bool:
        """One statement: of two deletes at once, one deletes and the other finds nothing (a 404)."""
        await self.ready()
        async with _reachable(), self.sessions() as session:
            result = await session.execute(
                delete(StoredResponse).where(StoredResponse.id == response_id, StoredResponse.owner == owner))
            await session.commit()
        return bool(getattr(result, "rowcount", 0))

    async def evict(self) -> None:
        """Delete what is past its time to live, in one statement (at start-up, then at most once a minute)."""
        self._evicted = time.time()
        async with _reachable(), self.sessions() as session:
            await session.execute(delete(StoredResponse).where(StoredResponse.expires_at <= int(self._evicted)))
            await session.commit()


def page(items: list[dict[str, Any]], after: str | None, limit: int, order: Literal["asc", "desc"]) -> ItemPage:
    """OpenAI's cursor pagination: items in `order`, those after the item `after`, at most `limit`."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in ordered]
        ordered = ordered[ids.index(after) + 1:] if after in ids else []
    return ItemPage(ordered[:limit], len(ordered) > limit)
