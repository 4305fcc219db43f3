"""Wire types shared by the completion and chat endpoints."""

from typing import Annotated, Any, Literal

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
TokenId = Annotated[int, Meta(ge=0)]
LogitBias = Annotated[float, Meta(ge=-100.0, le=100.0)]
# vLLM 0.32's limits; the salt must also be free of @ / \\ and NUL (serving/sampling.py says so).
CacheSalt = Annotated[str, Meta(min_length=1, max_length=128)]
RequestId = Annotated[str, Meta(min_length=1, max_length=256, pattern=r"^[ -~]+$")]
FinishReason = Literal["stop", "length", "abort", "tool_calls", "repetition"]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    # OpenAI pads stream events with random `obfuscation` text against side channels on their
    # payload sizes; Choir sends no padding, so true and false stream alike.
    include_obfuscation: bool | None = None


class StructuredOutputs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's `structured_outputs`: exactly one constraint (serving/structured.py checks it)."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    # Engine-wide settings in vLLM 0.32 (the per-request values are not read): refused unless default.
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class RepetitionDetection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Ends generation early on a repeated n-gram (finish_reason "repetition")."""

    max_pattern_size: Annotated[int, Meta(ge=0)] = 0
    min_pattern_size: Annotated[int, Meta(ge=0)] = 0
    min_count: Annotated[int, Meta(ge=0)] = 0


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields both generation endpoints accept: OpenAI's, then vLLM's extras (as vLLM 0.32 names them)."""

    model: str | None = None
    n: ChoiceCount = 1
    best_of: ChoiceCount | None = None  # best_of candidates, the n with the highest mean logprob returned
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, LogitBias] | None = None  # token id (as a string) → bias
    stop: str | list[str] | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's sampling extras
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Meta(ge=0)] = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: Annotated[list[TokenId], Meta(min_length=1)] | None = None
    bad_words: list[Annotated[str, Meta(min_length=1)]] | None = None
    prompt_logprobs: Annotated[int, Meta(ge=-1)] | None = None
    logprob_token_ids: Annotated[list[TokenId], Meta(min_length=1, max_length=128)] | None = None
    structured_outputs: StructuredOutputs | None = None
    repetition_detection: RepetitionDetection | None = None
    thinking_token_budget: Annotated[int, Meta(ge=-1)] | None = None
    stream_interval: Annotated[int, Meta(ge=1)] | None = None
    watermarking: bool | None = None
    vllm_xargs: dict[str, Any] | None = None
    # vLLM's request extras
    priority: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] = 0
    # The response id's base (X-Request-Id wins), echoed in the X-Request-Id header: printable ASCII.
    request_id: RequestId | None = None
    session_id: str | None = None
    cache_salt: CacheSalt | None = None
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool | None = None  # default: true for completions, false for chat (its template has them)
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    # vLLM fields Choir does not serve: accepted at their defaults, refused otherwise (serving/unserved.py)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    routed_experts_prompt_start: int = 0
    return_token_offsets: bool | None = None
    mm_payload: str | None = None
    return_mm_kwargs: bool | None = None
    # SGLang's request extras (`sglang_fields` in choir/spec/profiles: honoured, or ignored as vLLM ignores them).
    regex: str | None = None
    ebnf: str | None = None
    no_stop_trim: bool = False  # the stop string stays in the output (vLLM's include_stop_str_in_output)
    rid: RequestId | None = None  # SGLang's request_id
    extra_key: str | None = None  # salts the prefix cache, after cache_salt
    lora_path: str | None = None  # a loaded LoRA adapter's name
    # ... and those Choir does not serve: accepted at their defaults, refused otherwise (serving/unserved.py)
    stop_regex: str | list[str] | None = None
    session_params: dict[str, Any] | None = None
    custom_logit_processor: str | list[str | None] | None = None
    custom_params: dict[str, Any] | None = None
    return_hidden_states: bool | Literal["last"] = False
    return_routed_experts: bool = False
    return_cached_tokens_details: bool = False
    ngram_corpus_id: str | list[str | None] | None = None
    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int | None] | None = None
    bootstrap_room: int | list[int | None] | None = None
    routed_dp_rank: int | None = None
    data_parallel_rank: int | None = None
    disagg_prefill_dp_rank: int | None = None


# SGLang's own request fields, on either endpoint (CompletionRequest and ChatCompletionRequest add theirs).
SGLANG_FIELDS = frozenset({
    "regex", "ebnf", "no_stop_trim", "rid", "extra_key", "lora_path", "stop_regex", "session_params",
    "custom_logit_processor", "custom_params", "return_hidden_states", "return_routed_experts",
    "return_cached_tokens_details", "ngram_corpus_id", "bootstrap_host", "bootstrap_port", "bootstrap_room",
    "routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank",
    "json_schema",  # completions
    "separate_reasoning", "stream_reasoning", "input_ids", "return_prompt_token_ids", "return_meta_info",
    "max_dynamic_patch", "min_dynamic_patch",  # chat
})


class CompletionTokensDetails(msgspec.Struct):
    reasoning_tokens: int


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int  # prompt tokens the engine's prefix cache already held


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | UnsetType = UNSET  # when the engine reports cached tokens
    completion_tokens_details: CompletionTokensDetails | UnsetType = UNSET  # with a reasoning parser


class PromptLogprob(msgspec.Struct):
    """One candidate at one prompt position, as vLLM's `prompt_logprobs` give it."""

    logprob: float
    rank: int | None
    decoded_token: str | None


# Per prompt position: null for the first, else {token id (as a string): its logprob}.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(msgspec.Struct):
    error: ErrorDetail
