"""The Conversations API: /v1/conversations and its items (app/serving/conversations.py; the store is
plugins/store/). A conversation another API key made is not there (404)."""

from typing import Any, Literal

from litestar import Request
from litestar.params import SkipValidation

from app.routes.responses import check_limit, item_list, store_and_owner
from app.serving.conversations import as_conversation, conversation, needs_store, new_id, new_items
from app.serving.stored import conversation_not_found
from core.errors import APIError
from core.protocol.conversations import (
    Conversation,
    ConversationCreateRequest,
    ConversationItemsRequest,
    ConversationUpdateRequest,
    DeletedConversation,
)
from core.protocol.responses import ResponseItemList
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("createConversation")
async def create_conversation(data: SkipValidation[ConversationCreateRequest], request: Request,
                              pipeline: PipelineDependency) -> Conversation:
    body = pipeline.compat.admit(data, ConversationCreateRequest)
    store, owner = store_and_owner(request, pipeline)
    store = needs_store(store)
    items = new_items(body.items or [])
    return as_conversation(await store.conversations.create(owner, new_id(), body.metadata or {}, items))


@operation("getConversation")
async def get_conversation(conversation_id: str, request: Request, pipeline: PipelineDependency) -> Conversation:
    store, owner = store_and_owner(request, pipeline)
    return as_conversation(await conversation(store, owner, conversation_id))


@operation("updateConversation")
async def update_conversation(conversation_id: str, data: SkipValidation[ConversationUpdateRequest],
                              request: Request, pipeline: PipelineDependency) -> Conversation:
    body = pipeline.compat.admit(data, ConversationUpdateRequest)
    store, owner = store_and_owner(request, pipeline)
    await conversation(store, owner, conversation_id)
    assert store is not None
    row = await store.conversations.update(owner, conversation_id, body.metadata or {})
    return as_conversation(row if row is not None else await conversation(store, owner, conversation_id))


@operation("deleteConversation")
async def delete_conversation(conversation_id: str, request: Request,
                              pipeline: PipelineDependency) -> DeletedConversation:
    store, owner = store_and_owner(request, pipeline)
    await conversation(store, owner, conversation_id)
    assert store is not None
    await store.conversations.delete(owner, conversation_id)
    return DeletedConversation(id=conversation_id)


@operation("createConversationItems")
async def create_conversation_items(conversation_id: str, data: SkipValidation[ConversationItemsRequest],
                                    request: Request, pipeline: PipelineDependency) -> ResponseItemList:
    body = pipeline.compat.admit(data, ConversationItemsRequest)
    store, owner = store_and_owner(request, pipeline)
    await conversation(store, owner, conversation_id)
    assert store is not None
    added = await store.conversations.add(conversation_id, new_items(body.items))
    if added is None:
        raise conversation_not_found(conversation_id, "conversation_id")  # deleted meanwhile
    return item_list(added, False)


@operation("listConversationItems")
async def list_conversation_items(conversation_id: str, request: Request, pipeline: PipelineDependency,
                                  after: str | None = None, limit: int = 20, order: Literal["asc", "desc"] = "desc",
                                  before: str | None = None) -> ResponseItemList:
    check_limit(limit)
    store, owner = store_and_owner(request, pipeline)
    await conversation(store, owner, conversation_id)
    assert store is not None
    found = await store.conversations.page(conversation_id, after, limit, order, before)
    return item_list(found.items, found.has_more)


@operation("getConversationItem")
async def get_conversation_item(conversation_id: str, item_id: str, request: Request,
                                pipeline: PipelineDependency) -> dict[str, Any]:
    store, owner = store_and_owner(request, pipeline)
    await conversation(store, owner, conversation_id)
    assert store is not None
    item = await store.conversations.item(conversation_id, item_id)
    if item is None:
        raise _item_not_found(conversation_id, item_id)
    return item


@operation("deleteConversationItem")
async def delete_conversation_item(conversation_id: str, item_id: str, request: Request,
                                   pipeline: PipelineDependency) -> Conversation:
    """Answers the conversation, as OpenAI does."""
    store, owner = store_and_owner(request, pipeline)
    row = await conversation(store, owner, conversation_id)
    assert store is not None
    if not await store.conversations.delete_item(conversation_id, item_id):
        raise _item_not_found(conversation_id, item_id)
    return as_conversation(row)


def _item_not_found(conversation_id: str, item_id: str) -> APIError:
    return APIError(404, f"No item with id '{item_id}' is in conversation '{conversation_id}'.", "item_id")
