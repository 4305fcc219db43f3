"""What every store of tables shares: its sessions, who a request reads and writes as, the tables made on
first use (and again after a failure), and a database that cannot be reached told as a 503."""

import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from advanced_alchemy.exceptions import RepositoryError
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from choir.core.errors import APIError

log = structlog.get_logger("choir.store")


class StoreUnavailable(APIError):
    def __init__(self) -> None:
        super().__init__(503, "The response store is unavailable: stored responses and conversations cannot be "
                              "saved or read now. Requests with `store: false`, no previous_response_id and no "
                              "conversation are served as usual.")


@asynccontextmanager
async def reachable() -> AsyncIterator[None]:
    """A database that is down or unreachable is a 503 for the stateful call, not a 500."""
    try:
        yield
    except IntegrityError:
        raise APIError(409, "This conflicts with what is stored already (another request stored the same id at "
                            "the same time): send it again.") from None
    except (SQLAlchemyError, RepositoryError, OSError) as exc:
        log.warning("response store unavailable", error=str(exc).split("\n")[0])
        raise StoreUnavailable() from None


def owner_of(key: bytes | None) -> str:
    """Who a stored object belongs to: a digest of the API key (never the key), "" on an open server."""
    return hashlib.sha256(key).hexdigest() if key else ""


@dataclass(frozen=True)
class ItemPage:
    items: list[dict[str, Any]]
    has_more: bool


class Tables:
    """`prepare` makes the tables: run before the first use, and again after a failure, so a database that is
    down at start-up (or starts later) costs the stateful calls a 503 meanwhile, never the server its start."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], ttl: int | None, keyed: bool = False,
                 prepare: Callable[[], Awaitable[None]] | None = None) -> None:
        self.sessions, self.ttl, self.keyed, self._prepare = sessions, ttl, keyed, prepare

    def owner(self, key: bytes | None) -> str:
        """Who a request stores for and reads as: its API key's digest when the server has keys (each key
        sees only its own), else "" (an open server: everyone alike)."""
        return owner_of(key) if self.keyed and key else ""

    def expiry(self, now: int) -> int | None:
        return now + self.ttl if self.ttl else None

    async def ready(self) -> None:
        if self._prepare is not None:
            async with reachable():
                await self._prepare()
            self._prepare = None

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A session on tables that exist, its failures told as a 503."""
        await self.ready()
        async with reachable(), self.sessions() as session:
            yield session


def live(expires_at: int | None) -> bool:
    return expires_at is None or expires_at > time.time()


def page(items: list[dict[str, Any]], after: str | None, limit: int, order: Literal["asc", "desc"],
         before: str | None = None) -> ItemPage:
    """OpenAI's cursor pagination: items in `order`, those after the item `after` (the first `limit`) or
    before the item `before` (the last `limit`, those next to it)."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in ordered]
        ordered = ordered[ids.index(after) + 1:] if after in ids else []
    if before is not None:
        ids = [item.get("id") for item in ordered]
        cut = ordered[:ids.index(before)] if before in ids else []
        return ItemPage(cut[-limit:], len(cut) > limit)
    return ItemPage(ordered[:limit], len(ordered) > limit)
