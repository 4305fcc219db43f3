"""/v1/conversations wire types: the OpenAI Conversations API (a conversation's metadata and its items)."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

# OpenAI's bounds: at most 16 pairs, keys of at most 64 characters, values of at most 512.
Metadata = Annotated[dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
                     Meta(max_length=16)]
Items = Annotated[list[dict[str, Any]], Meta(max_length=20)]  # items added in one call


class ConversationCreateRequest(msgspec.Struct, kw_only=True):
    items: Items | None = None
    metadata: Metadata | None = None


class ConversationUpdateRequest(msgspec.Struct, kw_only=True):
    metadata: Metadata | None  # required, and may be null (no metadata)


class ConversationItemsRequest(msgspec.Struct, kw_only=True):
    items: Items


class Conversation(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str]


class DeletedConversation(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True
