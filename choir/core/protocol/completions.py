"""/v1/completions wire types."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from choir.core.protocol.chat import ResponseFormat
from choir.core.protocol.common import FinishReason, MaxTokens, PromptLogprobs, SamplingFields, Usage


class CompletionRequest(SamplingFields, kw_only=True):
    # A string, a list of strings, a list of token ids or a list of token-id lists. msgspec
    # allows one array type per union, so the list forms are checked in serving/prompts.py.
    prompt: str | list[Any] | None = None  # required: a missing one gets vLLM's 400 (serving/prompts.py)
    max_tokens: MaxTokens | None = 16
    logprobs: Annotated[int, Meta(ge=-1)] | None = None  # -1: the whole vocabulary, within --max-logprobs
    echo: bool = False
    suffix: str | None = None
    response_format: ResponseFormat | None = None  # vLLM takes it on completions too
    prompt_embeds: Any = None  # vLLM's; not served (refused when set)
    json_schema: str | None = None  # SGLang's: the JSON schema (as text) the output must follow


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
    # Only when asked for: `return_token_ids` (streamed: prompt_token_ids on a choice's first chunk), `prompt_logprobs`.
    # (null where the compat profile's `null_fields` says so)
    token_ids: list[int] | None | UnsetType = UNSET
    prompt_token_ids: list[int] | None | UnsetType = UNSET
    prompt_logprobs: PromptLogprobs | None | UnsetType = UNSET


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
