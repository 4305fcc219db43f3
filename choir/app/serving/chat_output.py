"""How one choice's generated text becomes message parts: content, reasoning and tool calls.

The configured reasoning and tool parsers (choir/engine/parsing.py) read reasoning and, for `tool_choice: auto`,
tool calls; what they call content is then read by a forced tool's structured-output reader
(`required`, named: choir/app/serving/tools.py), since the engine constrains only what follows the
reasoning. With no parser, all is content. Each choice gets its own `ChoiceOutput`, so parser
state is never shared between choices.
"""

from dataclasses import dataclass, field
from typing import Any

from choir.app.serving.json_text import JsonEscaper, escaped
from choir.app.serving.tools import ToolPlan, one_entry_per_call
from choir.engine.parsing import ChoiceParser, RequestParsers


@dataclass
class MessageParts:
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)

    def extend(self, more: "MessageParts") -> "MessageParts":
        return MessageParts(_join(self.content, more.content), _join(self.reasoning, more.reasoning),
                            [*self.tool_calls, *more.tool_calls])


def _join(a: str | None, b: str | None) -> str | None:
    return a + b if a and b else (a or b)


class ChoiceOutput:
    def __init__(self, tools: ToolPlan, parsers: RequestParsers | None, prompt_ids: list[int],
                 include_reasoning: bool = True, no_reasoning: bool = False, json_content: bool = False,
                 separate_reasoning: bool = True, stream_reasoning: bool = True) -> None:
        self.single_call = tools.single_call
        self.reader = tools.reader()
        self.parser: ChoiceParser | None = None
        if parsers is not None:
            self.parser = parsers.choice(use_tools=tools.kind == "auto", prompt_ids=prompt_ids,
                                         no_reasoning=no_reasoning, separate_reasoning=separate_reasoning)
        self.include_reasoning = include_reasoning  # false: the reasoning is read, and dropped
        # SGLang's stream_reasoning false: streamed reasoning is held until it ends, then sent in one delta
        self.held_reasoning: str | None = None if stream_reasoning else ""
        self.read_reasoning: str | None = None  # what the whole text had, shown or not (it is counted)
        self.escaper = JsonEscaper() if json_content else None  # constrained JSON content, as strict JSON
        self.called = False

    @property
    def reasons(self) -> bool:
        """Whether this choice has a reasoning parser (its messages then carry the reasoning field)."""
        return self.parser is not None and self.parser.has_reasoning

    def whole(self, text: str) -> MessageParts:
        if self.parser is not None:
            parsed = self.parser.complete(text)
            parts = MessageParts(parsed.content, parsed.reasoning, parsed.tool_calls)
        else:
            parts = MessageParts(content=text)
        if self.reader is not None:
            parts.content, parts.tool_calls = self.reader.complete(parts.content or "")
        elif self.escaper is not None and parts.content:
            parts.content = escaped(parts.content)
        if self.single_call:
            parts.tool_calls = parts.tool_calls[:1]
        self.read_reasoning = parts.reasoning
        if not self.include_reasoning:
            parts.reasoning = None
        self.called = bool(parts.tool_calls)
        return parts

    def delta(self, text: str, token_ids: list[int], finished: bool) -> MessageParts:
        if self.parser is not None:
            parsed = self.parser.feed(text, token_ids)
            parts = MessageParts(parsed.content, parsed.reasoning, parsed.tool_calls)
            if finished:
                rest = self.parser.finish()
                parts = parts.extend(MessageParts(rest.content, rest.reasoning, rest.tool_calls))
        else:
            parts = MessageParts(content=text or None)
        if self.reader is not None:
            calls = self.reader.feed(parts.content or "") if (parts.content or finished) else []
            parts.content, parts.tool_calls = None, calls
        elif self.escaper is not None and parts.content:
            parts.content = self.escaper.feed(parts.content)
        if not self.include_reasoning:
            parts.reasoning = None
        if self.held_reasoning is not None:
            self._hold_reasoning(parts, finished)
        if self.single_call:
            parts.tool_calls = [call for call in parts.tool_calls if call.index == 0]
        if parts.tool_calls:
            parts.tool_calls = one_entry_per_call(parts.tool_calls)
            self.called = True
        return parts

    def _hold_reasoning(self, parts: MessageParts, finished: bool) -> None:
        """The reasoning so far waits until something follows it (or the choice ends): then all of it goes."""
        self.held_reasoning = (self.held_reasoning or "") + (parts.reasoning or "")
        if parts.content or parts.tool_calls or finished:
            parts.reasoning, self.held_reasoning = self.held_reasoning or None, ""
        else:
            parts.reasoning = None

    def reasoning_tokens(self, token_ids: list[int], reasoning: str | None) -> int | None:
        return self.parser.reasoning_tokens(token_ids, reasoning) if self.parser is not None else None

    def streamed_reasoning_tokens(self) -> int | None:
        """reasoning_tokens for what this choice streamed (its parser kept the ids and the reasoning)."""
        return self.parser.streamed_reasoning_tokens() if self.parser is not None else None
