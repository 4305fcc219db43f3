"""POST /tokenize and /detokenize wire types: vLLM's shapes (its two tokenize forms in one object)."""

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from choir.core.protocol.chat import ChatMessage, Tool
from choir.core.protocol.common import TokenId


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """Text (`prompt`) or a conversation (`messages`, rendered with the chat template): send one."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | None = None
    add_special_tokens: bool | None = None  # default: true for `prompt`, false for `messages` (as vLLM)
    return_token_strs: bool = False  # also each token's piece of the vocabulary
    # `messages` only
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str
