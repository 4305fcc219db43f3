"""Stored files (OpenAI's Files API): each its owner's only, its bytes read apart from what is said of it (a
listing never loads a file's content). A file past its time to live is not there."""

import secrets
import time
from typing import Literal

from sqlalchemy import ColumnElement, delete, or_, select, update

from choir.plugins.store.models import StoredFile
from choir.plugins.store.tables import Tables, live


def new_file_id() -> str:
    """Time first (a listing's order within one second), then chance."""
    return f"file-{time.time_ns():016x}{secrets.token_hex(8)}"


EVICT_EVERY_SECONDS = 60


def _live() -> ColumnElement[bool]:
    return or_(StoredFile.expires_at.is_(None), StoredFile.expires_at > int(time.time()))


class FileStore(Tables):
    max_bytes = 200 * 1024 * 1024  # the largest file (CHOIR_MAX_FILE_BYTES)
    _evicted = 0.0

    async def create(self, owner: str, filename: str, purpose: str, content: bytes,
                     expires_after: int | None = None) -> StoredFile:
        """A new file; `expires_after`: seconds it lives (else the store's time to live, if it has one)."""
        now = int(time.time())
        expires = now + expires_after if expires_after else self.expiry(now)
        row = StoredFile(id=new_file_id(), owner=owner, created_at=now, expires_at=expires, filename=filename,
                         purpose=purpose, size=len(content), content=content)
        async with self.session() as session:
            session.add(row)
            await session.commit()
        if now - self._evicted > EVICT_EVERY_SECONDS:  # files may expire with no store TTL (expires_after)
            await self.evict()
        return row

    async def get(self, owner: str, file_id: str) -> StoredFile | None:
        async with self.session() as session:
            row = await session.scalar(select(StoredFile).where(StoredFile.id == file_id, StoredFile.owner == owner))
        return row if row is not None and live(row.expires_at) else None

    async def content(self, owner: str, file_id: str) -> bytes | None:
        async with self.session() as session:
            row = (await session.execute(select(StoredFile.content, StoredFile.expires_at).where(
                StoredFile.id == file_id, StoredFile.owner == owner))).first()
        return row[0] if row is not None and live(row[1]) else None

    async def list(self, owner: str, purpose: str | None, after: str | None, limit: int,
                   order: Literal["asc", "desc"]) -> tuple[list[StoredFile], bool]:
        """A page of the owner's live files, newest first for `desc`, those after the file `after`."""
        query = select(StoredFile).where(StoredFile.owner == owner, _live())
        if purpose is not None:
            query = query.where(StoredFile.purpose == purpose)
        newest_first = order == "desc"
        query = query.order_by(StoredFile.created_at.desc() if newest_first else StoredFile.created_at,
                               StoredFile.id.desc() if newest_first else StoredFile.id)
        async with self.session() as session:
            if after is not None:
                cursor = (await session.execute(select(StoredFile.created_at, StoredFile.id).where(
                    StoredFile.id == after, StoredFile.owner == owner))).first()
                if cursor is None:
                    return [], False
                at, last = cursor
                key, same = StoredFile.created_at, StoredFile.created_at == at
                query = query.where((key < at) | (same & (StoredFile.id < last)) if newest_first
                                    else (key > at) | (same & (StoredFile.id > last)))
            rows = list((await session.scalars(query.limit(limit + 1))).all())
        return rows[:limit], len(rows) > limit

    async def keep_until(self, file_id: str, until: int) -> None:
        """The file lives until `until` at least (a batch's input, until the batch's window ends)."""
        async with self.session() as session:
            await session.execute(update(StoredFile).where(StoredFile.id == file_id, StoredFile.expires_at < until)
                                  .values(expires_at=until))
            await session.commit()

    async def delete(self, owner: str, file_id: str) -> bool:
        async with self.session() as session:
            result = await session.execute(delete(StoredFile).where(StoredFile.id == file_id,
                                                                    StoredFile.owner == owner))
            await session.commit()
        return bool(getattr(result, "rowcount", 0))

    async def evict(self) -> None:
        """Delete the files past their time (at start-up, then at most once a minute)."""
        self._evicted = time.time()
        async with self.session() as session:
            await session.execute(delete(StoredFile).where(StoredFile.expires_at <= int(time.time())))
            await session.commit()
