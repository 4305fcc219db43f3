"""Choir's `Sampling` (choir/engine/sampling.py) → vLLM's SamplingParams, with the model's
generation_config defaults under what the request sets. vLLM's own checks of the values (min_tokens
over max_tokens, ...) are its refusals: `EngineRejected`, 400s naming the field where vLLM names one.

Fan-out's children differ from their parent in the seed alone (choir/plugins/fanout.py), so the last
translation is kept and a child gets a copy of it with its seed, as vLLM's own parallel sampling copies
its parent's params: an n = 4 request builds SamplingParams once, as it did before Choir owned the seam.
"""

import copy
from functools import cache
from typing import Any

import msgspec

from choir.engine.sampling import Constraint, Sampling
from choir.engine.vllm.errors import reraise

# Sampling fields passed to SamplingParams under the same name when set (None: the default applies).
_OPTIONAL_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "seed", "allowed_token_ids", "bad_words", "logprob_token_ids",
                    "stream_interval", "watermarking", "logit_bias", "thinking_token_budget", "extra_args")


@cache
def _vllm() -> tuple[Any, Any, Any, Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import RepetitionDetectionParams, RequestOutputKind, StructuredOutputsParams

    return SamplingParams, RequestOutputKind, RepetitionDetectionParams, StructuredOutputsParams


class SamplingAdapter:
    """Translates for one engine: `defaults` is its model's generation_config (vLLM's names)."""

    __slots__ = ("_last", "_params", "defaults")

    def __init__(self, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self._last: Sampling | None = None  # the last Sampling translated, and its translation (never sent)
        self._params: Any = None

    def __call__(self, sampling: Sampling) -> Any:
        """A SamplingParams of its own for one engine request (the engine may change what it is given)."""
        last = self._last
        if sampling is not last and not (sampling.seed is not None and last is not None and last.seed is not None
                                         and msgspec.structs.replace(sampling, seed=last.seed) == last):
            self._params, self._last = sampling_params(sampling, self.defaults), sampling
            # Built for this request alone: the engine need not deep-copy it again (vLLM's server says the same).
            return copy.copy(self._params)
        params = copy.copy(self._params)
        params.seed = sampling.seed
        return params


def sampling_params(sampling: Sampling, defaults: dict[str, Any]) -> Any:
    sampling_params_type, output_kind, repetition_params, _ = _vllm()
    values = dict(defaults)
    values.pop("max_tokens", None)  # Choir sizes every request's budget itself
    values.update({name: value for name in _OPTIONAL_FIELDS if (value := getattr(sampling, name)) is not None})
    try:
        if sampling.repetition_detection is not None:
            detection = sampling.repetition_detection
            values["repetition_detection"] = repetition_params(detection.max_pattern_size,
                                                               detection.min_pattern_size, detection.min_count)
        constraint = sampling.structured_outputs
        return sampling_params_type(
            n=1,
            max_tokens=sampling.max_tokens,
            stop=sampling.stop,
            stop_token_ids=sampling.stop_token_ids,
            ignore_eos=sampling.ignore_eos,
            min_tokens=sampling.min_tokens,
            # vLLM returns the logprobs of exactly logprob_token_ids instead of the top ones
            logprobs=None if sampling.logprob_token_ids else sampling.logprobs,
            prompt_logprobs=sampling.prompt_logprobs,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            skip_special_tokens=sampling.skip_special_tokens,
            spaces_between_special_tokens=sampling.spaces_between_special_tokens,
            output_kind=output_kind.DELTA if sampling.stream else output_kind.FINAL_ONLY,
            structured_outputs=None if constraint is None else structured_outputs_params(constraint),
            skip_clone=True,  # each request's own (the adapter copies one per child)
            **values,
        )
    except Exception as exc:  # vLLM's checks: its refusals (a bug of Choir's own stays what it is)
        reraise(exc)


def structured_outputs_params(constraint: Constraint) -> Any:
    """vLLM's StructuredOutputsParams for one constraint (its own checks are its refusals)."""
    given = {kind: value for kind in constraint.__struct_fields__ if (value := getattr(constraint, kind)) is not None}
    try:
        return _vllm()[3](**given)
    except Exception as exc:
        reraise(exc)
