"""OpenAI request fields → vLLM `SamplingParams`, and the context-length rules around them."""

from functools import cache
from typing import Any

from app.errors import bad_request
from app.protocol.common import SamplingFields

# Fields passed to SamplingParams under the same name when the request sets them.
_OPTIONAL_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "seed")


@cache
def _vllm() -> tuple[Any, Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams, RequestOutputKind


def build_sampling_params(request: SamplingFields, *, max_tokens: int, logprobs: int | None = None,
                          prompt_logprobs: int | None = None, defaults: dict[str, Any] | None = None,
                          structured_outputs: Any = None) -> Any:
    """Request value, else the model's generation_config default, else vLLM's (OpenAI's) default."""
    sampling_params, output_kind = _vllm()
    values: dict[str, Any] = dict(defaults or {})
    values.pop("max_tokens", None)
    values.update({name: getattr(request, name) for name in _OPTIONAL_FIELDS if getattr(request, name) is not None})
    stop = request.stop
    return sampling_params(
        n=1,
        max_tokens=max_tokens,
        stop=[stop] if isinstance(stop, str) else stop,
        stop_token_ids=request.stop_token_ids,
        ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        output_kind=output_kind.DELTA if request.stream else output_kind.FINAL_ONLY,
        structured_outputs=structured_outputs,
        # Built for this request alone (fan-out copies it per child), so the engine need not
        # deep-copy it again, as vLLM's own server says of its params.
        skip_clone=True,
        **values,
    )


def check_prompt_fits(prompt_tokens: int, max_model_len: int, param: str) -> None:
    if prompt_tokens >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_tokens} tokens, which leaves no room for output. Shorten the prompt.",
            param,
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
