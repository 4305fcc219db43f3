"""/v1/completions wire types."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from app.protocol.common import FinishReason, MaxTokens, SamplingFields, Usage


class CompletionRequest(SamplingFields, kw_only=True):
    # A string, a list of strings, a list of token ids or a list of token-id lists. msgspec
    # allows one array type per union, so the list forms are checked in serving/prompts.py.
    prompt: str | list[Any]
    max_tokens: MaxTokens | None = 16
    logprobs: Annotated[int, Meta(ge=0)] | None = None
    echo: bool = False
    suffix: str | None = None


class CompletionLogprobs(msgspec.Struct):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: int | str | None = None


class CompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | UnsetType = UNSET  # sent only where the compat profile says so


class CompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | UnsetType = UNSET
