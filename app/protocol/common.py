"""Wire types shared by the completion and chat endpoints."""

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=-1)]
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=2.0)]
Seed = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
MaxTokens = Annotated[int, Meta(ge=0)]
ChoiceCount = Annotated[int, Meta(ge=1)]
FinishReason = Literal["stop", "length", "abort", "tool_calls", "repetition"]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(msgspec.Struct, kw_only=True):
    """Sampling fields both generation endpoints accept (OpenAI's, plus vLLM's extras)."""

    model: str | None = None
    n: ChoiceCount = 1
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: Seed | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Meta(ge=0)] = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class CompletionTokensDetails(msgspec.Struct):
    reasoning_tokens: int


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | UnsetType = UNSET  # with a reasoning parser


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(msgspec.Struct):
    error: ErrorDetail
