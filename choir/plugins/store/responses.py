"""Stored responses: save one (its own turn, linked to the one it continued), read it or the chain it ends
(its owner's only), change a background response's state, keep and replay its stream's events, delete it.
A response another key made, or one past its time to live, is not there (a 404 to the caller)."""

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy import delete, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from choir.core.errors import APIError
from choir.plugins.store.models import StoredEvent, StoredResponse
from choir.plugins.store.tables import Tables, live

EVICT_EVERY_SECONDS = 60
UNFINISHED = ("queued", "in_progress")  # a background response's states before its last
CONTINUABLE = ("completed", "incomplete")  # what a previous_response_id may name
MAX_CHAIN = 1000  # turns a previous_response_id chain may have (its query reads no further)
HEARTBEAT_SECONDS = 5  # how often the process making a background response says it is still at work
STALE_SECONDS = 60  # a background response not heard of for this long was orphaned (its process died): failed
Event = tuple[int, str, str]  # an event's sequence number, type and JSON
InTransaction = Callable[[AsyncSession], Awaitable[object]]


class BrokenChain(Exception):
    """An earlier response of the conversation is gone (deleted, or expired)."""

    def __init__(self, missing: str) -> None:
        super().__init__(missing)
        self.missing = missing


class ChainTooLong(Exception):
    """More than MAX_CHAIN turns: a conversation that long belongs in the Conversations API."""


class NotContinuable(Exception):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


class ResponseStore(Tables):
    _evicted = 0.0

    async def check_free(self, response_id: str) -> None:
        """Before any work for a response to be stored: its id must be free (a client may reuse a request id),
        and the store reachable (a 503 now, not after the generation)."""
        async with self.session() as session:
            taken = await session.scalar(select(StoredResponse.id).where(StoredResponse.id == response_id))
        if taken is not None:
            raise APIError(409, f"A response with id '{response_id}' is stored already: send another request id "
                                "(X-Request-Id or `request_id`), or `store: false`.", "request_id")

    async def save(self, owner: str, body: dict[str, Any], input_items: list[dict[str, Any]],
                   previous: Sequence[str] = ()) -> None:
        """A new response; `previous`: the chain it continues (their time to live starts again with it)."""
        now = int(time.time())
        expires = self.expiry(now)
        row = StoredResponse(id=body["id"], owner=owner, created_at=now, expires_at=expires, status=body["status"],
                             background=bool(body.get("background")), previous_id=previous[-1] if previous else None,
                             body=body, input_items=input_items,
                             heartbeat_at=now if body.get("background") else None)
        async with self.session() as session:
            session.add(row)
            if previous and expires is not None:
                await session.execute(update(StoredResponse).where(StoredResponse.id.in_(list(previous)))
                                      .values(expires_at=expires))
            await session.commit()
        if self.ttl and now - self._evicted > EVICT_EVERY_SECONDS:
            await self.evict()

    async def get(self, owner: str, response_id: str) -> StoredResponse | None:
        async with self.session() as session:
            row = await session.scalar(select(StoredResponse).where(StoredResponse.id == response_id,
                                                                    StoredResponse.owner == owner))
        if row is None or not live(row.expires_at):
            return None
        if row.background and row.status in UNFINISHED and _stale(row.heartbeat_at):
            await self._reap(row)
            return await self.get(owner, response_id)
        return row

    async def _reap(self, row: StoredResponse) -> None:
        """An orphaned background response (the process making it died) stored as failed, if it still is."""
        error = {"code": "server_error", "message": "The server process making this background response stopped."}
        async with self.session() as session:
            await session.execute(update(StoredResponse).where(
                StoredResponse.id == row.id, StoredResponse.status == row.status,
                StoredResponse.heartbeat_at == row.heartbeat_at).values(
                status="failed", body={**row.body, "status": "failed", "error": error}))
            await session.commit()

    async def chain(self, owner: str, response_id: str) -> list[StoredResponse]:
        """The responses a continuation of `response_id` follows, oldest first, read in one recursive query of
        at most MAX_CHAIN turns ([] if `response_id` is not this owner's). BrokenChain if an earlier one is
        gone, ChainTooLong past MAX_CHAIN, NotContinuable if it has not ended well."""
        start = select(StoredResponse.id, StoredResponse.previous_id, literal(1).label("depth")).where(
            StoredResponse.id == response_id, StoredResponse.owner == owner).cte("chain", recursive=True)
        step = select(StoredResponse.id, StoredResponse.previous_id, (start.c.depth + 1).label("depth")).join(
            start, StoredResponse.id == start.c.previous_id).where(StoredResponse.owner == owner,
                                                                   start.c.depth < MAX_CHAIN)
        links = start.union_all(step)
        query = select(StoredResponse).join(links, StoredResponse.id == links.c.id).order_by(links.c.depth.desc())
        async with self.session() as session:
            rows = list((await session.scalars(query)).all())
        if not rows or not live(rows[-1].expires_at):
            return []
        if rows[-1].status not in CONTINUABLE:
            raise NotContinuable(rows[-1].status)
        if rows[0].previous_id is not None:
            if len(rows) >= MAX_CHAIN:
                raise ChainTooLong()
            raise BrokenChain(rows[0].previous_id)
        for row in rows:
            if not live(row.expires_at):
                raise BrokenChain(row.id)
        return rows

    async def change(self, response_id: str, body: dict[str, Any]) -> bool:
        """A background response's new state; False if it was cancelled meanwhile (or is gone)."""
        async with self.session() as session:
            result = await session.execute(update(StoredResponse).where(
                StoredResponse.id == response_id, StoredResponse.status.in_(UNFINISHED)).values(
                status=body["status"], body=body))
            await session.commit()
        return bool(getattr(result, "rowcount", 0))

    async def cancel(self, owner: str, response_id: str) -> tuple[StoredResponse | None, bool]:
        """A background response cancelled, in one conditional statement: of a cancel and the response's own
        ending, whichever lands first wins. Cancelling what has ended already changes nothing (OpenAI's
        cancel is idempotent). The response (None if there is none), and whether this cancel took effect."""
        row = await self.get(owner, response_id)
        if row is None or not row.background or row.status not in UNFINISHED:
            return row, False
        body = {**row.body, "status": "cancelled"}
        async with self.session() as session:
            result = await session.execute(update(StoredResponse).where(
                StoredResponse.id == response_id, StoredResponse.status.in_(UNFINISHED)).values(
                status="cancelled", body=body))
            await session.commit()
        return await self.get(owner, response_id), bool(getattr(result, "rowcount", 0))

    async def heartbeat(self, response_id: str) -> bool:
        """The process making a background response is still at work; False if it was cancelled (or is gone)."""
        async with self.session() as session:
            going = await self._still_going(session, response_id)
            await session.commit()
        return going

    async def _still_going(self, session: AsyncSession, response_id: str) -> bool:
        """One conditional update: it also holds the row (PostgreSQL) or the database (SQLite) until the
        transaction ends, so a cancel lands before it or after the events written with it."""
        result = await session.execute(update(StoredResponse).where(
            StoredResponse.id == response_id, StoredResponse.status.in_(UNFINISHED)).values(
            heartbeat_at=int(time.time())))
        return bool(getattr(result, "rowcount", 0))

    async def add_events(self, response_id: str, events: list[Event], body: dict[str, Any] | None = None,
                         then: InTransaction | None = None) -> bool:
        """A background response's next events, and with its last ones its final state (`body`) and what must
        change with it (`then`: its turn added to its conversation), in one transaction: a stream that reads the
        state first, then the events, misses none. Nothing is written if it was cancelled meanwhile (False:
        its run stops)."""
        async with self.session() as session:
            if body is not None:
                result = await session.execute(update(StoredResponse).where(
                    StoredResponse.id == response_id, StoredResponse.status.in_(UNFINISHED)).values(
                    status=body["status"], body=body, heartbeat_at=int(time.time())))
                going = bool(getattr(result, "rowcount", 0))
            else:
                going = await self._still_going(session, response_id)
            if going and events:
                await session.execute(insert(StoredEvent), [
                    {"response_id": response_id, "sequence": sequence, "kind": kind, "data": data}
                    for sequence, kind, data in events])
            if going and then is not None:
                await then(session)
            await session.commit()
        return going

    async def events(self, response_id: str, after: int) -> tuple[str | None, list[Event]]:
        """The response's status, then the stored events after sequence number `after`: when the status is
        final, every event is among them (its last events were stored with it)."""
        async with self.session() as session:
            row = (await session.execute(select(StoredResponse.status, StoredResponse.heartbeat_at).where(
                StoredResponse.id == response_id))).first()
            status = row[0] if row is not None else None
            if status in UNFINISHED and _stale(row[1] if row is not None else None):
                status = "failed"  # orphaned: reaped by the next GET; this stream ends
            await session.commit()  # PostgreSQL: the events are read in a snapshot taken after the status
            rows = (await session.execute(select(StoredEvent.sequence, StoredEvent.kind, StoredEvent.data).where(
                StoredEvent.response_id == response_id, StoredEvent.sequence > after).order_by(
                StoredEvent.sequence))).all()
        return status, [(row[0], row[1], row[2]) for row in rows]

    async def delete(self, owner: str, response_id: str) -> bool:
        """One statement for the response: of two deletes at once, one deletes and the other finds nothing."""
        async with self.session() as session:
            result = await session.execute(
                delete(StoredResponse).where(StoredResponse.id == response_id, StoredResponse.owner == owner))
            if getattr(result, "rowcount", 0):
                await session.execute(delete(StoredEvent).where(StoredEvent.response_id == response_id))
            await session.commit()
        return bool(getattr(result, "rowcount", 0))

    async def evict(self) -> None:
        """Delete what is past its time to live (at start-up, then at most once a minute)."""
        self._evicted = time.time()
        expired = select(StoredResponse.id).where(StoredResponse.expires_at <= int(self._evicted))
        async with self.session() as session:
            await session.execute(delete(StoredEvent).where(StoredEvent.response_id.in_(expired)))
            await session.execute(delete(StoredResponse).where(StoredResponse.expires_at <= int(self._evicted)))
            await session.commit()


def _stale(heartbeat_at: int | None) -> bool:
    return heartbeat_at is not None and heartbeat_at < time.time() - STALE_SECONDS
