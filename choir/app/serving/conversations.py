"""The Conversations API over the store: a conversation's items are checked as input items are (each one a
400 naming it if the model could not be sent it), then kept with an id and a status, in order."""

import secrets
from typing import Any

from choir.app.serving.responses import messages_of
from choir.app.serving.stored import conversation_not_found, input_items
from choir.core.errors import bad_request
from choir.core.protocol.conversations import Conversation
from choir.plugins.store.models import StoredConversation
from choir.plugins.store.store import Store


def new_items(items: list[dict[str, Any]], param: str = "items") -> list[dict[str, Any]]:
    """Items to add, each with an id (its own, or a new one) and a status."""
    messages_of(items, param)  # the same 400s as the items sent as `input`
    return input_items(items, param)


def new_id() -> str:
    return f"conv_{secrets.token_hex(24)}"


def as_conversation(row: StoredConversation) -> Conversation:
    return Conversation(id=row.id, created_at=row.created_at, metadata=row.meta or {})


def needs_store(store: Store | None) -> Store:
    if store is None:
        raise bad_request("Conversations need the store, and this server runs without one (CHOIR_STORE=off).")
    return store


async def conversation(store: Store | None, owner: str, conversation_id: str) -> StoredConversation:
    """This key's conversation, or a 404 (another key's is not there)."""
    row = await store.conversations.get(owner, conversation_id) if store is not None else None
    if row is None:
        raise conversation_not_found(conversation_id, "conversation_id")
    return row
