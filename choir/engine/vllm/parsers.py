"""vLLM's own reasoning and tool parsers (CHOIR_REASONING_PARSER, CHOIR_TOOL_PARSER) behind the seam's
`Parsers` (choir/engine/parsing.py): bound to a request as vLLM's ChatCompletionRequest, which they
read, then one fresh set per choice, so the n choices of a request never share parser state.

Streaming, text goes through the reasoning parser first and what it calls content through the tool
parser, as vLLM's server does. When the choice ends, the streamed parts are reconciled with a
whole-text parse, so that what a client assembles from the stream equals the non-streamed answer
(a parser may hold back text that only looked like the start of a marker: it comes out then).
"""

import os
from typing import Any

import msgspec

from choir.core.protocol import without_none
from choir.core.protocol.chat import ChatCompletionRequest, DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from choir.core.settings import SettingsError
from choir.engine.parsing import Parsed, tool_call_id
from choir.engine.sampling import Constraint
from choir.engine.vllm.sampling import structured_outputs_params


class VllmParsers:
    """The configured parser classes and the tokenizer they are built with (`load` once the engine has
    started: they need its tokenizer)."""

    __slots__ = ("reasoning", "tokenizer", "tool", "tool_name")

    def __init__(self, tokenizer: Any, reasoning: type | None = None, tool: type | None = None,
                 tool_name: str | None = None) -> None:
        self.tokenizer, self.reasoning, self.tool, self.tool_name = tokenizer, reasoning, tool, tool_name

    @classmethod
    def load(cls, tokenizer: Any, reasoning: str | None, tool: str | None) -> "VllmParsers":
        return cls(tokenizer, *parser_classes(reasoning, tool), tool_name=tool)

    @property
    def reasons(self) -> bool:
        return self.reasoning is not None

    def bind(self, request: ChatCompletionRequest, model: str, template_kwargs: dict[str, Any]) -> "BoundParsers":
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChatRequest

        vllm_request = VllmChatRequest.model_validate({**without_none(msgspec.to_builtins(request)), "model": model})
        return BoundParsers(self, vllm_request, template_kwargs)


class BoundParsers:
    """The parsers for one request, built as vLLM's server builds them: the reasoning parser sees the chat
    template kwargs (Qwen3 reads `enable_thinking` there), the tool parser the request's tools."""

    __slots__ = ("parsers", "request", "template_kwargs")

    def __init__(self, parsers: VllmParsers, request: Any, template_kwargs: dict[str, Any]) -> None:
        self.parsers, self.request, self.template_kwargs = parsers, request, template_kwargs

    def choice(self, use_tools: bool, prompt_ids: list[int], no_reasoning: bool = False,
               separate_reasoning: bool = True) -> "ChoiceParser | None":
        parsers = self.parsers
        reasoning = self._reasoning_parser() if parsers.reasoning and separate_reasoning else None
        tool = parsers.tool(parsers.tokenizer, self.request.tools) if (parsers.tool and use_tools) else None
        if not (reasoning or tool):
            return None
        # A prompt that already ended the reasoning (a template with thinking off writes `<think></think>`)
        # leaves none to read, whichever parser: vLLM's streaming path makes the same check. So does an
        # output the engine constrained from its first token (`no_reasoning`).
        ended = reasoning is not None and (no_reasoning or reasoning.is_reasoning_end(list(prompt_ids)))
        return ChoiceParser(reasoning, tool, self.request, reasoning_ended=ended)

    def reasoning_ended(self, prompt_ids: list[int]) -> bool:
        return bool(self._reasoning_parser().is_reasoning_end(list(prompt_ids)))

    def calls_or(self, answer: Constraint) -> dict[str, Any] | None:
        model = getattr(self.parsers.tool, "structural_tag_model", None)
        if model is None or not self.request.tools:
            return None
        from vllm.parser.abstract_parser import structured_outputs_to_format
        from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag, limit_to_single_tool_call
        from vllm.tool_parsers.tool_strict_level import ToolStrictLevel
        from xgrammar import StructuralTag
        from xgrammar.structural_tag import OrFormat

        # "required": the calls branch must hold a call (auto's would also allow free text); the arguments
        # follow each tool's schema, as Choir's forced calls do.
        calls = get_model_structural_tag(model=model, tools=self.request.tools, tool_choice="required",
                                         reasoning=False, strict_level=ToolStrictLevel.PARAMETER)
        if calls is None:
            return None
        if self.request.parallel_tool_calls is False:
            limit_to_single_tool_call(calls)
        answer_format = structured_outputs_to_format(structured_outputs_params(answer))
        tag = StructuralTag(format=OrFormat(elements=[calls.format, answer_format]))
        return dict(tag.model_dump())

    def _reasoning_parser(self) -> Any:
        parsers = self.parsers
        assert parsers.reasoning is not None, "no reasoning parser is configured"
        return parsers.reasoning(parsers.tokenizer, chat_template_kwargs=dict(self.template_kwargs))


_IMPORTED: set[str] = set()  # parser plugins imported in this process


def parser_classes(reasoning: str | None, tool: str | None,
                   plugins: tuple[str, ...] = ()) -> tuple[type | None, type | None]:
    """The parser classes of these names, after importing `plugins` (vLLM's --tool-parser-plugin and
    --reasoning-parser-plugin files, which register parsers of their own); SettingsError naming the known ones
    for a name vLLM lacks."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.import_utils import import_from_path

    for plugin in plugins:
        if plugin not in _IMPORTED:
            try:  # as vLLM's import_plugin, but a failure stops start-up (vLLM's logs it and goes on)
                import_from_path(os.path.splitext(os.path.basename(plugin))[0], plugin)
            except Exception as exc:
                raise SettingsError(f"The parser plugin {plugin} cannot be imported: {exc}") from None
            _IMPORTED.add(plugin)
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
    """One choice's vLLM parsers (the seam's ChoiceParser)."""

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

    def streamed_reasoning_tokens(self) -> int | None:
        return self.reasoning_tokens(self.ids, self.sent.reasoning)

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
