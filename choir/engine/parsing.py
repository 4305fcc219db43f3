"""The reasoning and tool parsers, as the serving side uses them: what a chat choice's text says, in
Choir's message types. The engine's adapter provides them (choir/engine/vllm/parsers.py: vLLM's own
parsers, CHOIR_REASONING_PARSER and CHOIR_TOOL_PARSER), bound to one request, then one per choice, so
the n choices of a request never share parser state."""

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from choir.core.protocol.chat import ChatCompletionRequest
from choir.engine.sampling import Constraint


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class Parsed:
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[Any] = field(default_factory=list)  # ToolCall (whole) or DeltaToolCall (streamed)


class ChoiceParser(Protocol):
    """One choice's parsers. Streaming, `feed` each delta, then `finish`: what the stream still owes to
    equal the whole-text parse (`complete`), so that a client assembles exactly the non-streamed answer."""

    @property
    def has_reasoning(self) -> bool: ...

    def complete(self, text: str) -> Parsed: ...

    def feed(self, delta: str, delta_ids: list[int]) -> Parsed: ...

    def finish(self) -> Parsed: ...

    def reasoning_tokens(self, token_ids: list[int], reasoning: str | None) -> int | None:
        """The tokens of the text this parser calls reasoning (None: no reasoning parser)."""
        ...

    def streamed_reasoning_tokens(self) -> int | None:
        """reasoning_tokens of what was fed, and the reasoning the stream said."""
        ...


class RequestParsers(Protocol):
    """The parsers bound to one chat request: its tools, and the chat template kwargs it rendered with."""

    def choice(self, use_tools: bool, prompt_ids: list[int], no_reasoning: bool = False,
               separate_reasoning: bool = True) -> ChoiceParser | None:
        """A choice's parsers; None when no parser has anything to read. `no_reasoning`: the engine
        constrained the output from its first token; `separate_reasoning` false leaves reasoning in the content."""
        ...

    def reasoning_ended(self, prompt_ids: list[int]) -> bool:
        """Whether the prompt already ended the reasoning (a template with thinking off writes `<think></think>`)."""
        ...

    def calls_or(self, answer: Constraint) -> dict[str, Any] | None:
        """xgrammar's structural tag for "the tool parser's calls, or an answer under `answer`" (tool_choice
        `auto` beside a response format); None where the parser cannot describe its calls so."""
        ...


class Parsers(Protocol):
    """The configured parsers (either may be absent)."""

    @property
    def tool_name(self) -> str | None: ...  # CHOIR_TOOL_PARSER: tool_choice `auto` needs one

    @property
    def reasons(self) -> bool: ...  # a reasoning parser is configured

    def bind(self, request: ChatCompletionRequest, model: str, template_kwargs: dict[str, Any]) -> RequestParsers:
        ...

