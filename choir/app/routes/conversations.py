"""The Conversations API: /v1/conversations and its items (choir/app/serving/conversations.py; the store is
choir/plugins/store/). A conversation another API key made is not there (404)."""

from typing import Any, Literal

from litestar import Request
from litestar.params import SkipValidation

from choir.app.routes.responses import check_limit, item_list, store_and_owner
from choir.app.serving.conversations import as_conversation, conversation, needs_store, new_id, new_items
from choir.app.serving.stored import conversation_not_found
from choir.core.errors import APIError
from choir.core.protocol.conversations import (
    Conversation,
    ConversationCreateRequest,
    ConversationItemsRequest,
    ConversationUpdateRequest,
    DeletedConversation,
)
from choir.core.protocol.responses import ResponseItemList
from choir.plugins.pipeline import Pipeline, PipelineDependency
from choir.plugins.spec import operation
from choir.plugins.store.conversations import ConversationStore
from choir.plugins.store.models import StoredConversation


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
    conversations, owner, row = await _owned(request, pipeline, conversation_id)
    updated = await conversations.update(owner, conversation_id, body.metadata or {})
    return as_conversation(updated or row)


@operation("deleteConversation")
async def delete_conversation(conversation_id: str, request: Request,
                              pipeline: PipelineDependency) -> DeletedConversation:
    conversations, owner, _ = await _owned(request, pipeline, conversation_id)
    await conversations.delete(owner, conversation_id)
    return DeletedConversation(id=conversation_id)


@operation("createConversationItems")
async def create_conversation_items(conversation_id: str, data: SkipValidation[ConversationItemsRequest],
                                    request: Request, pipeline: PipelineDependency) -> ResponseItemList:
    body = pipeline.compat.admit(data, ConversationItemsRequest)
    conversations, _, _ = await _owned(request, pipeline, conversation_id)
    added = await conversations.add(conversation_id, new_items(body.items))
    if added is None:
        raise conversation_not_found(conversation_id, "conversation_id")  # deleted meanwhile
    return item_list(added, False)


@operation("listConversationItems")
async def list_conversation_items(conversation_id: str, request: Request, pipeline: PipelineDependency,
                                  after: str | None = None, limit: int = 20, order: Literal["asc", "desc"] = "desc",
                                  before: str | None = None) -> ResponseItemList:
    check_limit(limit)
    conversations, _, _ = await _owned(request, pipeline, conversation_id)
    found = await conversations.page(conversation_id, after, limit, order, before)
    return item_list(found.items, found.has_more)


@operation("getConversationItem")
async def get_conversation_item(conversation_id: str, item_id: str, request: Request,
                                pipeline: PipelineDependency) -> dict[str, Any]:
    conversations, _, _ = await _owned(request, pipeline, conversation_id)
    item = await conversations.item(conversation_id, item_id)
    if item is None:
        raise _item_not_found(conversation_id, item_id)
    return item


@operation("deleteConversationItem")
async def delete_conversation_item(conversation_id: str, item_id: str, request: Request,
                                   pipeline: PipelineDependency) -> Conversation:
    """Answers the conversation, as OpenAI does."""
    conversations, _, row = await _owned(request, pipeline, conversation_id)
    if not await conversations.delete_item(conversation_id, item_id):
        raise _item_not_found(conversation_id, item_id)
    return as_conversation(row)


async def _owned(request: Request, pipeline: Pipeline,
                 conversation_id: str) -> tuple[ConversationStore, str, StoredConversation]:
    """The store's conversations, who calls, and the conversation (a 404 unless it is this key's)."""
    store, owner = store_and_owner(request, pipeline)
    row = await conversation(store, owner, conversation_id)
    assert store is not None
    return store.conversations, owner, row


def _item_not_found(conversation_id: str, item_id: str) -> APIError:
    return APIError(404, f"No item with id '{item_id}' is in conversation '{conversation_id}'.", "item_id")
