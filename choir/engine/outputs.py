"""What an engine request yields, as the serving side reads it: one `EngineOutput` per engine step (the
step's delta when the request streams, else the final output alone).

Structural types: vLLM's own `RequestOutput`, `CompletionOutput` and `Logprob` have these members
and pass the seam as they are, with no copy per token; a test engine yields plain dataclasses.
"""

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol


class Logprob(Protocol):
    """One candidate token at one position."""

    @property
    def logprob(self) -> float: ...

    @property
    def rank(self) -> int | None: ...

    @property
    def decoded_token(self) -> str | None: ...


Position = Mapping[int, Logprob]  # a position's candidates: token id → its logprob
# Why a sample ended (None while it runs). vLLM's "error" (a retryable failure inside the engine) is not
# one a request is answered with.
FinishReason = Literal["stop", "length", "abort", "repetition"]


class SampleOutput(Protocol):
    """One sample's text and tokens: all of them, or what this step added (streaming)."""

    @property
    def index(self) -> int: ...

    @property
    def text(self) -> str: ...

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def cumulative_logprob(self) -> float | None: ...

    @property
    def logprobs(self) -> Sequence[Position] | None: ...  # one per token, when asked for

    @property
    def finish_reason(self) -> FinishReason | None: ...

    @property
    def stop_reason(self) -> int | str | None: ...  # the stop string or token id that ended it


class EngineOutput(Protocol):
    @property
    def request_id(self) -> str: ...

    @property
    def outputs(self) -> Sequence[SampleOutput]: ...  # one: Choir's engine requests sample once

    @property
    def prompt_token_ids(self) -> Sequence[int] | None: ...

    @property
    def prompt_logprobs(self) -> Sequence[Position | None] | None: ...  # the first position has none

    @property
    def num_cached_tokens(self) -> int | None: ...  # prompt tokens the prefix cache held

    @property
    def finished(self) -> bool: ...
