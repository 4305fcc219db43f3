"""Stored batches (OpenAI's Batch API): each its owner's only; run by one process at a time, which claims it in
the store and keeps saying so (a batch whose runner went quiet is claimed by another, which goes on from the
lines not yet answered); each answered line stored as it is answered, so none is answered twice."""

import secrets
import time
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from choir.plugins.store.models import BatchLine, StoredBatch
from choir.plugins.store.tables import Tables

RUNNING = ("validating", "in_progress", "finalizing", "cancelling")  # the states a runner works on
STALE_SECONDS = 30  # a runner not heard of for this long is gone: its batch is claimed again


def new_batch_id() -> str:
    return f"batch_{time.time_ns():016x}{secrets.token_hex(8)}"


class BatchStore(Tables):
    async def create(self, owner: str, body: dict[str, Any]) -> StoredBatch:
        row = StoredBatch(id=body["id"], owner=owner, created_at=body["created_at"], status=body["status"], body=body)
        async with self.session() as session:
            session.add(row)
            await session.commit()
        return row

    async def get(self, owner: str | None, batch_id: str) -> StoredBatch | None:
        """`owner` None: whoever's (the runner's read)."""
        query = select(StoredBatch).where(StoredBatch.id == batch_id)
        if owner is not None:
            query = query.where(StoredBatch.owner == owner)
        async with self.session() as session:
            return await session.scalar(query)

    async def page(self, owner: str, after: str | None, limit: int) -> tuple[list[StoredBatch], bool]:
        """Newest first, those after the batch `after` (ids sort by time)."""
        query = select(StoredBatch).where(StoredBatch.owner == owner).order_by(StoredBatch.id.desc())
        if after is not None:
            query = query.where(StoredBatch.id < after)
        async with self.session() as session:
            rows = list((await session.scalars(query.limit(limit + 1))).all())
        return rows[:limit], len(rows) > limit

    async def change(self, batch_id: str, body: dict[str, Any], states: tuple[str, ...] = RUNNING,
                     runner: str | None = None) -> bool:
        """The batch's new object, if it is still in one of `states` (a cancel may have landed meanwhile) and, given
        `runner`, still that runner's."""
        held = [StoredBatch.runner == runner] if runner is not None else []
        async with self.session() as session:
            result = await session.execute(update(StoredBatch).where(
                StoredBatch.id == batch_id, StoredBatch.status.in_(states), *held).values(status=body["status"],
                                                                                        body=body))
            await session.commit()
        return bool(getattr(result, "rowcount", 0))

    async def claim(self, runner: str) -> StoredBatch | None:
        """A batch to run that no live runner holds, now this runner's (one conditional update: of two processes
        that try at once, one gets it)."""
        now = int(time.time())
        async with self.session() as session:
            candidates = (await session.scalars(select(StoredBatch.id).where(
                StoredBatch.status.in_(RUNNING),
                or_(StoredBatch.runner.is_(None), StoredBatch.heartbeat_at < now - STALE_SECONDS)).order_by(
                StoredBatch.id).limit(8))).all()
            for batch_id in candidates:
                result = await session.execute(update(StoredBatch).where(
                    StoredBatch.id == batch_id, StoredBatch.status.in_(RUNNING),
                    or_(StoredBatch.runner.is_(None), StoredBatch.heartbeat_at < now - STALE_SECONDS)).values(
                    runner=runner, heartbeat_at=now))
                await session.commit()
                if getattr(result, "rowcount", 0):
                    return await session.scalar(select(StoredBatch).where(StoredBatch.id == batch_id))
        return None

    async def heartbeat(self, batch_id: str, runner: str) -> str | None:
        """This runner still holds the batch: its status now (None: another runner took it, or it is gone)."""
        async with self.session() as session:
            result = await session.execute(update(StoredBatch).where(
                StoredBatch.id == batch_id, StoredBatch.runner == runner).values(heartbeat_at=int(time.time())))
            await session.commit()
            if not getattr(result, "rowcount", 0):
                return None
            return await session.scalar(select(StoredBatch.status).where(StoredBatch.id == batch_id))

    async def release(self, batch_id: str, runner: str) -> None:
        async with self.session() as session:
            await session.execute(update(StoredBatch).where(
                StoredBatch.id == batch_id, StoredBatch.runner == runner).values(runner=None))
            await session.commit()

    async def answered(self, batch_id: str) -> set[int]:
        async with self.session() as session:
            return set((await session.scalars(select(BatchLine.line).where(BatchLine.batch_id == batch_id))).all())

    async def answer(self, batch_id: str, line: int, ok: bool, result: dict[str, Any]) -> bool:
        """A line's answer, unless it has one already (False then: the first stays)."""
        async with self.session() as session:
            dialect = session.get_bind().dialect.name
            statement = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(BatchLine).values(
                batch_id=batch_id, line=line, ok=ok, result=result).on_conflict_do_nothing()
            outcome = await session.execute(statement)
            await session.commit()
        return bool(getattr(outcome, "rowcount", 0))

    async def answers(self, batch_id: str) -> list[tuple[bool, dict[str, Any]]]:
        """Every answered line, in the input file's order."""
        async with self.session() as session:
            rows = (await session.execute(select(BatchLine.ok, BatchLine.result).where(
                BatchLine.batch_id == batch_id).order_by(BatchLine.line))).all()
        return [(row[0], row[1]) for row in rows]
