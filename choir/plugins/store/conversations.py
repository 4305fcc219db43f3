"""Stored conversations (the Conversations API): a conversation's metadata, and its items in the order they
were added. Items are added under the conversation's row lock, so the items of one call stay together when
two calls add to one conversation at once; a page is read by position in the database, not in Python."""

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from choir.plugins.store.models import ConversationItem, StoredConversation
from choir.plugins.store.tables import ItemPage, Tables, live

EVICT_EVERY_SECONDS = 60


async def append(session: AsyncSession, conversation_id: str, items: list[dict[str, Any]],
                 expires_at: int | None) -> list[dict[str, Any]] | None:
    """Items added to a conversation in the caller's transaction, after the conversation's row is locked (PostgreSQL:
    the row; SQLite: the database), so that the items of one call stay together; its time to live starts again.
    An id the conversation holds already (or one repeated among the items) is replaced by a new one: ids are the
    client's to choose, and unique within a conversation. None: the conversation is gone."""
    result = await session.execute(update(StoredConversation).where(StoredConversation.id == conversation_id)
                                   .values(expires_at=expires_at))
    if not getattr(result, "rowcount", 0):
        return None
    wanted = [item["id"] for item in items]
    taken = set((await session.scalars(select(ConversationItem.id).where(
        ConversationItem.conversation_id == conversation_id, ConversationItem.id.in_(wanted)))).all())
    added = []
    for item in items:
        if item["id"] in taken:
            item = {**item, "id": f"{item['id'].split('_', 1)[0]}_{secrets.token_hex(12)}"}
        taken.add(item["id"])
        added.append(item)
    session.add_all([ConversationItem(id=item["id"], conversation_id=conversation_id, item=item) for item in added])
    return added


class ConversationStore(Tables):
    _evicted = 0.0

    async def create(self, owner: str, conversation_id: str, meta: dict[str, str],
                     items: list[dict[str, Any]]) -> StoredConversation:
        now = int(time.time())
        row = StoredConversation(id=conversation_id, owner=owner, created_at=now, expires_at=self.expiry(now),
                                 meta=meta)
        async with self.session() as session:
            session.add(row)
            await session.flush()
            await append(session, conversation_id, items, row.expires_at)
            await session.commit()
        if self.ttl and now - self._evicted > EVICT_EVERY_SECONDS:
            await self.evict()
        return row

    def appending(self, conversation_id: str,
                  items: list[dict[str, Any]]) -> Callable[[AsyncSession], Awaitable[object]]:
        """`append` of these items, for another store's transaction (a background response's final state)."""
        async def then(session: AsyncSession) -> object:
            return await append(session, conversation_id, items, self.expiry(int(time.time())))

        return then

    async def get(self, owner: str, conversation_id: str) -> StoredConversation | None:
        async with self.session() as session:
            row = await session.scalar(select(StoredConversation).where(StoredConversation.id == conversation_id,
                                                                        StoredConversation.owner == owner))
        return row if row is not None and live(row.expires_at) else None

    async def update(self, owner: str, conversation_id: str, meta: dict[str, str]) -> StoredConversation | None:
        async with self.session() as session:
            await session.execute(update(StoredConversation).where(
                StoredConversation.id == conversation_id, StoredConversation.owner == owner).values(meta=meta))
            await session.commit()
        return await self.get(owner, conversation_id)

    async def delete(self, owner: str, conversation_id: str) -> bool:
        async with self.session() as session:
            result = await session.execute(delete(StoredConversation).where(
                StoredConversation.id == conversation_id, StoredConversation.owner == owner))
            if getattr(result, "rowcount", 0):
                await session.execute(delete(ConversationItem).where(
                    ConversationItem.conversation_id == conversation_id))
            await session.commit()
        return bool(getattr(result, "rowcount", 0))

    async def add(self, conversation_id: str, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Items added after the others, together (as added: see `append`). None: the conversation is gone."""
        async with self.session() as session:
            added = await append(session, conversation_id, items, self.expiry(int(time.time())))
            await session.commit()
        return added

    async def items(self, conversation_id: str) -> list[dict[str, Any]]:
        """Every item, oldest first: what a response in this conversation continues from."""
        async with self.session() as session:
            rows = await session.scalars(select(ConversationItem.item).where(
                ConversationItem.conversation_id == conversation_id).order_by(ConversationItem.position))
            return list(rows.all())

    async def page(self, conversation_id: str, after: str | None, limit: int, order: Literal["asc", "desc"],
                   before: str | None = None) -> ItemPage:
        """OpenAI's cursor page: items in `order`, the first `limit` after the item `after`, or the last
        `limit` before the item `before` (those next to it)."""
        position = ConversationItem.position
        query = select(ConversationItem.item).where(ConversationItem.conversation_id == conversation_id)
        forward = order == "asc"
        for cursor, later in ((after, forward), (before, not forward)):
            if cursor is not None:
                at = select(position).where(ConversationItem.id == cursor,
                                            ConversationItem.conversation_id == conversation_id).scalar_subquery()
                query = query.where(position > at if later else position < at)
        backwards = before is not None  # read from the cursor outwards, then put back in `order`
        ascending = forward != backwards
        query = query.order_by(position if ascending else position.desc()).limit(limit + 1)
        async with self.session() as session:
            found = list((await session.scalars(query)).all())
        kept = found[:limit]
        return ItemPage(kept[::-1] if backwards else kept, len(found) > limit)

    async def item(self, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        async with self.session() as session:
            return await session.scalar(select(ConversationItem.item).where(
                ConversationItem.id == item_id, ConversationItem.conversation_id == conversation_id))

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        async with self.session() as session:
            result = await session.execute(delete(ConversationItem).where(
                ConversationItem.id == item_id, ConversationItem.conversation_id == conversation_id))
            await session.commit()
        return bool(getattr(result, "rowcount", 0))

    async def evict(self) -> None:
        self._evicted = time.time()
        now = int(self._evicted)
        expired = select(StoredConversation.id).where(StoredConversation.expires_at <= now)
        async with self.session() as session:
            await session.execute(delete(ConversationItem).where(ConversationItem.conversation_id.in_(expired)))
            await session.execute(delete(StoredConversation).where(StoredConversation.expires_at <= now))
            await session.commit()
