"""OpenAI and vLLM request fields → what the engine takes: the `Sampling` of each engine request, how
the prompt is tokenized (`RenderOptions`) and what else each engine request carries (`GenerateOptions`),
with the context-length rules around them. The engine's own checks of the values come when it gets
them (choir/engine/vllm/sampling.py)."""

from typing import Any

from choir.core.errors import PromptTooLong, bad_request
from choir.core.protocol.common import SamplingFields
from choir.engine.protocol import NO_OPTIONS, GenerateOptions, RenderOptions
from choir.engine.sampling import Constraint, Sampling

_CACHE_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")


def build_sampling_params(request: SamplingFields, *, max_tokens: int, logprobs: int | None = None,
                          prompt_logprobs: int | None = None, structured_outputs: Constraint | None = None) -> Sampling:
    """The request's values; what it leaves out is the model's generation_config default, else the engine's
    (OpenAI's). One sample (fan-out makes n)."""
    logit_bias = _logit_bias(request.logit_bias) if request.logit_bias else None
    if request.logprob_token_ids is not None and logprobs is None:
        raise bad_request("logprob_token_ids needs logprobs: the ids are the tokens whose logprobs are returned.",
                          "logprob_token_ids")
    stop, budget = request.stop, request.thinking_token_budget
    return Sampling(
        max_tokens=max_tokens,
        stream=request.stream,
        stop=[stop] if isinstance(stop, str) else stop,
        stop_token_ids=request.stop_token_ids,
        ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens,
        logprobs=logprobs,
        logprob_token_ids=request.logprob_token_ids,
        prompt_logprobs=prompt_logprobs,
        include_stop_str_in_output=request.include_stop_str_in_output or request.no_stop_trim,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        structured_outputs=structured_outputs,
        seed=request.seed,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        min_p=request.min_p,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        repetition_penalty=request.repetition_penalty,
        allowed_token_ids=request.allowed_token_ids,
        bad_words=request.bad_words,
        logit_bias=logit_bias,
        repetition_detection=request.repetition_detection,
        thinking_token_budget=budget if budget is not None and budget >= 0 else None,  # -1: unlimited
        stream_interval=request.stream_interval,
        watermarking=request.watermarking,
        extra_args=dict(request.vllm_xargs) if request.vllm_xargs else None,
    )


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    """Token ids as strings → ints; every key that is not one is named (the engine names those out of
    its vocabulary)."""
    converted, bad = {}, []
    for token, value in bias.items():
        try:
            token_id = int(token)
        except ValueError:
            token_id = -1
        if token_id < 0 or str(token_id) != token.strip():
            bad.append(token)
        converted[token_id] = value
    if bad:
        raise bad_request(f"logit_bias keys are token ids (non-negative integers, as strings); these are not: "
                          f"{', '.join(repr(token) for token in bad)}.", "logit_bias")
    return converted


def check_prompt_logprobs(request: SamplingFields) -> int | None:
    """`prompt_logprobs` (0 and up, or -1 for the whole vocabulary), which no stream can carry."""
    wanted = request.prompt_logprobs
    if wanted is not None and request.stream:
        raise bad_request("prompt_logprobs are not available when stream is true.", "prompt_logprobs")
    return wanted


def render_options(request: SamplingFields, *, chat: bool, max_model_len: int, max_tokens: int | None,
                   detokenize: bool = False) -> RenderOptions:
    salt = request.cache_salt
    if request.extra_key:  # SGLang's: the prefix cache's namespace, after cache_salt (as SGLang joins them)
        salt = (salt or "") + request.extra_key
        if len(salt) > 128:
            raise bad_request("cache_salt and extra_key together must not exceed 128 characters.", "extra_key")
    if salt is not None and any(ch in salt for ch in _CACHE_SALT_FORBIDDEN):
        param = "cache_salt" if request.cache_salt and any(c in request.cache_salt for c in _CACHE_SALT_FORBIDDEN) \
            else "extra_key"
        raise bad_request(f"{param} must not contain '@', '/', '\\' or NUL.", param)
    if request.truncation_side is not None and request.truncate_prompt_tokens is None:
        raise bad_request("truncation_side needs truncate_prompt_tokens: the number of prompt tokens to keep.",
                          "truncation_side")
    keep = request.truncate_prompt_tokens
    if keep == -1:  # as many as leave room for the output
        keep = max(1, max_model_len - max(max_tokens or 1, 1))
    add_special = request.add_special_tokens if request.add_special_tokens is not None else not chat
    return RenderOptions(add_special_tokens=add_special, detokenize=detokenize, truncate_prompt_tokens=keep,
                         truncation_side=request.truncation_side, cache_salt=salt)


def generate_options(request: SamplingFields, priority_scheduling: bool, adapter: str | None = None,
                     reasoning_ended: bool | None = None,
                     reasoning_parser_kwargs: dict[str, Any] | None = None) -> GenerateOptions:
    if request.priority and not priority_scheduling:
        # vLLM 0.32 documents this error but no longer raises it: the priority would be ignored.
        raise bad_request("priority needs priority scheduling: start the server with `--scheduling-policy "
                          "priority` in CHOIR_ENGINE_ARGS, or leave priority at 0.", "priority")
    if not (adapter or request.priority or request.session_id or reasoning_ended is not None
            or reasoning_parser_kwargs):
        return NO_OPTIONS
    return GenerateOptions(adapter=adapter, priority=request.priority, session_id=request.session_id,
                           reasoning_ended=reasoning_ended, reasoning_parser_kwargs=reasoning_parser_kwargs)


def check_prompt_fits(prompt_tokens: int, max_model_len: int, param: str) -> None:
    if prompt_tokens >= max_model_len:
        raise PromptTooLong(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_tokens} tokens, which leaves no room for output. Shorten the prompt.",
            param, prompt_tokens, max_model_len,
        )


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_model_len: int, param: str) -> int:
    """The requested output budget, clamped to what the context leaves after the prompt."""
    if requested is not None and requested > max_model_len:
        raise bad_request(
            f"{param}={requested} is greater than the model's maximum context length "
            f"({max_model_len} tokens). Request fewer output tokens.",
            param,
        )
    room = max_model_len - prompt_tokens
    return room if requested is None else min(requested, room)
