"""vLLM's own reasoning and tool parsers (CHOIR_REASONING_PARSER, CHOIR_TOOL_PARSER), one fresh set
per choice, so the n choices of a request never share parser state.

Streaming, text goes through the reasoning parser first and what it calls content through the tool
parser, as vLLM's server does. When the choice ends, the streamed parts are reconciled with a
whole-text parse, so that what a client assembles from the stream equals the non-streamed answer
(a parser may hold back text that only looked like the start of a marker: it comes out then).
"""

from dataclasses import dataclass, field
from typing import Any

from app.serving.tools import tool_call_id
from core.protocol.chat import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from core.settings import SettingsError


@dataclass
class Parsed:
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[Any] = field(default_factory=list)  # ToolCall (whole) or DeltaToolCall (streamed)


@dataclass(frozen=True)
class ParserSet:
    """The configured parser classes and the tokenizer they are built with (app/parsers_plugin.py
    builds it once the engine has started)."""

    tokenizer: Any
    reasoning: type | None = None
    tool: type | None = None
    tool_name: str | None = None  # CHOIR_TOOL_PARSER: tool_choice `auto` needs one

    @classmethod
    def load(cls, tokenizer: Any, reasoning: str | None, tool: str | None) -> "ParserSet":
        return cls(tokenizer, *parser_classes(reasoning, tool), tool_name=tool)

    def for_choice(self, request: Any, use_tools: bool, template_kwargs: dict[str, Any] | None = None,
                   prompt_ids: list[int] | None = None, no_reasoning: bool = False,
                   separate_reasoning: bool = True) -> "ChoiceParser | None":
        """A choice's parsers, built as vLLM's server builds them: the reasoning parser sees the chat
        template kwargs (Qwen3 reads `enable_thinking` there), the tool parser the request's tools.
        `separate_reasoning` false (SGLang's) reads no reasoning: it stays in the content."""
        reasoning = self.reasoning_parser(template_kwargs) if self.reasoning and separate_reasoning else None
        tool = self.tool(self.tokenizer, request.tools) if (self.tool and use_tools) else None
        if not (reasoning or tool):
            return None
        # A prompt that already ended the reasoning (a template with thinking off writes `<think></think>`)
        # leaves none to read, whichever parser: vLLM's streaming path makes the same check. So does an
        # output the engine constrained from its first token (`no_reasoning`).
        ended = reasoning is not None and (no_reasoning or reasoning.is_reasoning_end(list(prompt_ids or [])))
        return ChoiceParser(reasoning, tool, request, reasoning_ended=ended)

    def calls_or(self, request: Any, answer: Any) -> dict[str, Any] | None:
        """xgrammar's structural tag for "the tool parser's calls, or an answer in this format" (vLLM's
        StructuredOutputsParams): what tool_choice `auto` beside a response format means. None where the
        parser cannot describe its calls as a structural tag (vLLM's own builders, per parser)."""
        model = getattr(self.tool, "structural_tag_model", None)
        if model is None or not request.tools:
            return None
        from vllm.parser.abstract_parser import structured_outputs_to_format
        from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag, limit_to_single_tool_call
        from vllm.tool_parsers.tool_strict_level import ToolStrictLevel
        from xgrammar import StructuralTag
        from xgrammar.structural_tag import OrFormat

        # "required": the calls branch must hold a call (auto's would also allow free text); the arguments
        # follow each tool's schema, as Choir's forced calls do.
        calls = get_model_structural_tag(model=model, tools=request.tools, tool_choice="required", reasoning=False,
                                         strict_level=ToolStrictLevel.PARAMETER)
        if calls is None:
            return None
        if request.parallel_tool_calls is False:
            limit_to_single_tool_call(calls)
        tag = StructuralTag(format=OrFormat(elements=[calls.format, structured_outputs_to_format(answer)]))
        return tag.model_dump()

    def reasoning_parser(self, template_kwargs: dict[str, Any] | None = None) -> Any:
        assert self.reasoning is not None, "no reasoning parser is configured"
        return self.reasoning(self.tokenizer, chat_template_kwargs=dict(template_kwargs or {}))


def parser_classes(reasoning: str | None, tool: str | None) -> tuple[type | None, type | None]:
    """The parser classes of these names; SettingsError naming the known ones for a name vLLM lacks."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return (_lookup(ReasoningParserManager, reasoning, "CHOIR_REASONING_PARSER"),
            _lookup(ToolParserManager, tool, "CHOIR_TOOL_PARSER"))


def _lookup(manager: Any, name: str | None, setting: str) -> type | None:
    if name is None:
        return None
    get = getattr(manager, "get_reasoning_parser", None) or manager.get_tool_parser
    try:
        return get(name)
    except KeyError:
        known = ", ".join(sorted(manager.list_registered()))
        raise SettingsError(f"{setting}={name!r} is not a vLLM parser: {known}.") from None


class ChoiceParser:
    def __init__(self, reasoning: Any, tool: Any, request: Any, reasoning_ended: bool = False) -> None:
        self.reasoning_parser, self.tool_parser, self.request = reasoning, tool, request
        self.reasoning_ended = reasoning_ended  # by the prompt: all the output is content
        self.text, self.content_text = "", ""
        self.ids: list[int] = []
        self.content_ids: list[int] = []
        self.sent = Parsed()  # what the stream has said, to reconcile at the end
        self.sent_args: dict[int, str] = {}
        self.sent_names: dict[int, str] = {}

    @property
    def has_reasoning(self) -> bool:
        return self.reasoning_parser is not None

    def complete(self, text: str) -> Parsed:
        reasoning, content = None, text
        if self.reasoning_parser is not None and not self.reasoning_ended:
            reasoning, content = self.reasoning_parser.extract_reasoning(text, self.request)
        calls: list[ToolCall] = []
        if self.tool_parser is not None and content:
            info = self.tool_parser.extract_tool_calls(content, self.request)
            if info.tools_called:
                content = info.content
                calls = [ToolCall(id=call.id or tool_call_id(), function=FunctionCall(
                    name=call.function.name, arguments=call.function.arguments)) for call in info.tool_calls]
        return Parsed(reasoning, content, calls)

    def reasoning_tokens(self, token_ids: list[int], reasoning: str | None) -> int | None:
        """The tokens of the text this parser calls reasoning. vLLM's own count_reasoning_tokens
        counts only tokens between both markers, and so says 0 where deepseek_r1 reads reasoning
        before an end marker with no start marker."""
        parser = self.reasoning_parser
        if parser is None:
            return None
        if not reasoning:
            return 0
        start, end = getattr(parser, "start_token_id", None), getattr(parser, "end_token_id", None)
        if end is None:
            return parser.count_reasoning_tokens(token_ids)
        ids = list(token_ids)
        before_end = ids[: ids.index(end)] if end in ids else ids
        return sum(1 for token in before_end if token != start)

    def feed(self, delta: str, delta_ids: list[int]) -> Parsed:
        previous, previous_ids = self.text, self.ids
        self.text, self.ids = previous + delta, [*previous_ids, *delta_ids]
        out = Parsed(content=delta)
        content_ids = delta_ids
        if self.reasoning_parser is not None and not self.reasoning_ended:
            message = self.reasoning_parser.extract_reasoning_streaming(
                previous, self.text, delta, previous_ids, self.ids, delta_ids)
            out.reasoning = message.reasoning if message else None
            out.content = message.content if message else None
            start = getattr(self.reasoning_parser, "start_token", None)
            if out.reasoning and start and start in out.reasoning:
                # vLLM's think parsers keep the start marker when it arrives with other tokens in one delta
                out.reasoning = out.reasoning.replace(start, "", 1) or None
            if out.content and delta_ids:  # the content's own ids: those after the end marker
                content_ids = self.reasoning_parser.extract_content_ids(list(delta_ids)) or delta_ids
        if self.tool_parser is not None and out.content:
            before, before_ids = self.content_text, self.content_ids
            self.content_text, self.content_ids = before + out.content, [*before_ids, *content_ids]
            message = self.tool_parser.extract_tool_calls_streaming(
                before, self.content_text, out.content, before_ids, self.content_ids, content_ids, self.request)
            out.content = message.content if message else None
            out.tool_calls = [self._delta_call(call) for call in (message.tool_calls if message else [])]
        self._record(out)
        return out

    def finish(self) -> Parsed:
        """What the stream still owes to equal the whole-text parse."""
        whole = self.complete(self.text)
        rest = Parsed(reasoning=_suffix(self.sent.reasoning, whole.reasoning),
                      content=_suffix(self.sent.content, whole.content))
        for index, call in enumerate(whole.tool_calls):
            if index not in self.sent_names:
                rest.tool_calls.append(DeltaToolCall(index=index, id=call.id, type="function",
                                                     function=DeltaFunctionCall(name=call.function.name,
                                                                                arguments="")))
            missing = _suffix(self.sent_args.get(index), call.function.arguments)
            if missing:
                rest.tool_calls.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=missing)))
        self._record(rest)
        return rest

    def _delta_call(self, call: Any) -> DeltaToolCall:
        function = call.function
        out = DeltaToolCall(index=call.index)
        if function is not None and function.name:
            out.id, out.type = call.id or tool_call_id(), "function"
            out.function = DeltaFunctionCall(name=function.name, arguments=function.arguments or "")
        elif function is not None and function.arguments:
            out.function = DeltaFunctionCall(arguments=function.arguments)
        return out

    def _record(self, parsed: Parsed) -> None:
        if parsed.reasoning:
            self.sent.reasoning = (self.sent.reasoning or "") + parsed.reasoning
        if parsed.content:
            self.sent.content = (self.sent.content or "") + parsed.content
        for call in parsed.tool_calls:
            if isinstance(call.function, DeltaFunctionCall):
                if isinstance(call.function.name, str):
                    self.sent_names[call.index] = call.function.name
                if isinstance(call.function.arguments, str):
                    self.sent_args[call.index] = self.sent_args.get(call.index, "") + call.function.arguments


def _suffix(sent: str | None, whole: str | None) -> str | None:
    """The part of `whole` the stream has not sent, when what it sent is a prefix of it."""
    sent, whole = sent or "", whole or ""
    return whole[len(sent):] or None if whole.startswith(sent) else None
