"""Fan-out: OpenAI `n` becomes n child engine requests, sampled exactly as vLLM's parallel sampling
samples them (`vllm/v1/engine/parallel_sampling.py`): child i has request id `f"{i}_{parent}"` and
seed `seed + i` (unseeded stays unseeded), every other sampling field unchanged. With n = 1 the
request keeps its id and params, so n = 1 is untouched. (Unseeded children share their parent's
`Sampling`, which is immutable; the engine's adapter gives each engine request its own copy.)

Under data parallelism (several engine ranks) `placement` says where the children run: "spread", each
where vLLM's balancer puts it (the children decode in parallel on several engines), or "pinned", all on
one rank, the ranks taken in turn (one prefill, one prefix cache). CHOIR_FANOUT_PLACEMENT sets it;
benchmarks/placement.py measures both.
"""

import itertools
import os
from dataclasses import dataclass, field, replace

import msgspec

from choir.core.errors import bad_request
from choir.core.protocol.common import INT64_MAX
from choir.engine.protocol import NO_OPTIONS, GenerateOptions, Prompt
from choir.engine.sampling import Sampling
from choir.plugins.metrics import FANOUT_CHILDREN


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """One prompt of a request, before fan-out: the engine request it would be with n = 1."""

    prompt_index: int
    prompt: Prompt
    params: Sampling
    request_id: str
    options: GenerateOptions = NO_OPTIONS


@dataclass(frozen=True, slots=True)
class Choice:
    """One engine request, answering one choice of the response."""

    index: int  # prompt_index * n + sample index: the choice's index in the response
    prompt_index: int
    prompt: Prompt
    params: Sampling
    request_id: str
    options: GenerateOptions = NO_OPTIONS


@dataclass(frozen=True)
class FanOut:
    max_n: int = 128  # CHOIR_MAX_N
    max_prompts: int = 1024  # CHOIR_MAX_PROMPTS
    max_choices: int = 1024  # CHOIR_MAX_CHOICES: n × prompts, the engine requests one request may make
    placement: str = "pinned"  # CHOIR_FANOUT_PLACEMENT: "spread" or "pinned" (with several engine ranks)
    _turns: "itertools.count[int]" = field(default_factory=lambda: itertools.count(os.getpid()), repr=False,
                                           compare=False)

    def check(self, n: int, seed: int | None) -> None:
        if n > self.max_n:
            raise bad_request(f"n must be at most {self.max_n} (CHOIR_MAX_N), got {n}.", "n")
        if seed is not None and seed + n - 1 > INT64_MAX:
            raise bad_request("`seed + n - 1` must fit in a signed 64-bit integer.", "seed")

    def check_prompts(self, prompts: int, n: int, param: str = "prompt") -> None:
        if prompts > self.max_prompts:
            raise bad_request(f"At most {self.max_prompts} prompts (CHOIR_MAX_PROMPTS) per request, got {prompts}.",
                              param)
        if prompts * n > self.max_choices:
            raise bad_request(f"n × prompts must be at most {self.max_choices} (CHOIR_MAX_CHOICES), got "
                              f"{n} × {prompts} = {n * prompts}.", "n")

    def choices(self, requests: list[PromptRequest], n: int, ranks: int = 1) -> list[Choice]:
        """`ranks`: the engine's data-parallel ranks."""
        if n == 1:
            return [Choice(r.prompt_index, r.prompt_index, r.prompt, r.params, r.request_id, r.options)
                    for r in requests]
        FANOUT_CHILDREN.inc(n * len(requests))
        if ranks > 1 and self.placement == "pinned":
            rank = next(self._turns) % ranks  # one rank for all of this request's children
            requests = [replace(r, options=msgspec.structs.replace(r.options, data_parallel_rank=rank))
                        for r in requests]
        return [
            Choice(r.prompt_index * n + i, r.prompt_index, r.prompt, _child_params(r.params, i), f"{i}_{r.request_id}",
                   r.options)
            for r in requests
            for i in range(n)
        ]


def _child_params(params: Sampling, index: int) -> Sampling:
    return params if params.seed is None else msgspec.structs.replace(params, seed=params.seed + index)
