"""What one engine request samples, in Choir's terms: the serving side builds a `Sampling` from the
request's fields, fan-out derives each child's (its seed), and the engine adapter turns it into its own
parameters (choir/engine/vllm/sampling.py: vLLM's SamplingParams, whose checks are its 400s).

The fields are vLLM's sampling parameters under vLLM's names, so a field means what vLLM documents. A
field left None is not the request's to set: the model's generation_config default applies, else the
engine's own (OpenAI's) default.
"""

from typing import Any, TypeGuard

import msgspec

from choir.core.protocol.common import RepetitionDetection

__all__ = ["Constraint", "RepetitionDetection", "Sampling", "is_json"]


class Constraint(msgspec.Struct, frozen=True, kw_only=True):
    """An output constraint (structured outputs): exactly one of these is set."""

    json: dict[str, Any] | str | None = None  # a JSON schema (as text, or parsed)
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # EBNF
    json_object: bool | None = None  # any JSON object
    structural_tag: str | None = None  # xgrammar's structural tag, as JSON text


def is_json(constraint: Constraint | None) -> TypeGuard[Constraint]:
    """Whether the engine constrains the output to JSON (then it is read as strict JSON text)."""
    return constraint is not None and (constraint.json is not None or bool(constraint.json_object))


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    """One engine request's sampling: one sample of one prompt (fan-out makes n of them)."""

    max_tokens: int
    stream: bool = False  # an output per engine step with what it added; else the final output only
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # the top k candidates' logprobs per output token (-1: the whole vocabulary)
    logprob_token_ids: list[int] | None = None  # instead: the logprobs of exactly these tokens
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    structured_outputs: Constraint | None = None
    seed: int | None = None
    # None: the model's default (generation_config), else the engine's.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    # vLLM's extras, each off while None.
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    logit_bias: dict[int, float] | None = None  # token id → bias
    repetition_detection: RepetitionDetection | None = None
    thinking_token_budget: int | None = None
    stream_interval: int | None = None
    watermarking: bool | None = None
    extra_args: dict[str, Any] | None = None  # vLLM's `vllm_xargs`, for custom logits processors
