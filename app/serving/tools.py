"""Tool calls on chat: `tool_choice` decides how the output is constrained and how it is read back.

`required` and a named tool constrain the output with a JSON schema built from the tools (vLLM's
structured outputs), so they work with any model: a named tool's output is its arguments; a
required choice's output is `[{"name": ..., "parameters": {...}}, ...]`. `auto` needs a vLLM tool
parser (CHOIR_TOOL_PARSER), which reads calls out of free text (app/serving/parsers.py).
"""

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from app.serving.json_text import JsonEscaper, escaped
from app.serving.tool_stream import ToolArrayScanner
from core.errors import bad_request
from core.protocol.chat import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    NamedToolChoice,
    TextFormat,
    ToolCall,
)

EMPTY_OBJECT = {"type": "object", "properties": {}}


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolPlan:
    kind: Literal["none", "auto", "required", "named"]
    function: str | None = None  # the named tool
    schema: dict[str, Any] | None = None  # constrains the output (required, named)
    template_tools: list[dict[str, Any]] | None = None  # what the chat template is shown
    single_call: bool = False  # parallel_tool_calls: false (the schema enforces it for `required`)

    def reader(self) -> "NamedToolReader | RequiredToolReader | None":
        if self.kind == "named":
            return NamedToolReader(self.function or "")
        if self.kind == "required":
            return RequiredToolReader()
        return None


def plan_tools(request: ChatCompletionRequest, tool_parser: str | None) -> ToolPlan:
    tools = request.tools or []
    choice = request.tool_choice if request.tool_choice is not None else ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise bad_request("tool_choice needs `tools`: list the functions the model may call.", "tool_choice")
    template_tools = [{"type": "function", "function": _builtins(t.function)} for t in tools] or None
    if choice == "none":
        return ToolPlan("none", template_tools=template_tools)
    if request.response_format is not None and not isinstance(request.response_format, TextFormat):
        raise bad_request("response_format cannot be combined with tool_choice other than `none`.", "response_format")
    parameters = {t.function.name: t.function.parameters or EMPTY_OBJECT for t in tools}
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in parameters:
            raise bad_request(f"tool_choice names `{name}`, which is not one of the `tools`: "
                              f"{', '.join(parameters)}.", "tool_choice")
        return ToolPlan("named", function=name, schema=parameters[name], template_tools=template_tools)
    if choice == "required":
        return ToolPlan("required", schema=_calls_schema(parameters, request.parallel_tool_calls),
                        template_tools=template_tools)
    if tool_parser is None:
        raise bad_request("tool_choice `auto` needs a tool parser: start the server with CHOIR_TOOL_PARSER set "
                          "(e.g. hermes), or send tool_choice `required` or a named tool.", "tool_choice")
    return ToolPlan("auto", template_tools=template_tools, single_call=request.parallel_tool_calls is False)


def _calls_schema(parameters: dict[str, dict[str, Any]], parallel: bool | None) -> dict[str, Any]:
    calls = [{"type": "object", "properties": {"name": {"const": name}, "parameters": schema},
              "required": ["name", "parameters"], "additionalProperties": False}
             for name, schema in parameters.items()]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if parallel is False:  # only an explicit false limits the calls to one
        schema["maxItems"] = 1
    return schema


def _builtins(function: Any) -> dict[str, Any]:
    return {k: v for k, v in {"name": function.name, "description": function.description,
                              "parameters": function.parameters}.items() if v is not None}


class NamedToolReader:
    """A forced tool: the whole output is the call's arguments (as strict JSON: app/serving/json_text.py);
    `content` is ""."""

    def __init__(self, function: str) -> None:
        self.function, self.id, self.started = function, tool_call_id(), False
        self.escaper = JsonEscaper()

    def complete(self, text: str) -> tuple[str | None, list[ToolCall]]:
        return "", [ToolCall(id=self.id, function=FunctionCall(name=self.function, arguments=escaped(text)))]

    def feed(self, delta: str) -> list[DeltaToolCall]:
        calls = []
        if not self.started:
            self.started = True
            calls.append(DeltaToolCall(index=0, id=self.id, type="function",
                                       function=DeltaFunctionCall(name=self.function, arguments="")))
        if delta:
            calls.append(DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=self.escaper.feed(delta))))
        return calls


class RequiredToolReader:
    """`required`: the output is a JSON array of {"name", "parameters"}; each becomes a call."""

    def __init__(self) -> None:
        self.scanner = ToolArrayScanner()
        self.ids: list[str] = []
        self.escapers: list[JsonEscaper] = []  # one per call: its arguments as strict JSON

    def complete(self, text: str) -> tuple[str | None, list[ToolCall]]:
        try:
            calls = json.loads(text, strict=False)  # raw control characters in strings: escaped by the dump
            return None, [ToolCall(id=tool_call_id(), function=FunctionCall(
                name=call["name"], arguments=json.dumps(call["parameters"], ensure_ascii=False))) for call in calls]
        except (ValueError, TypeError, KeyError):
            # Cut short (finish_reason "length"): the calls as far as they got, exactly as a stream of the
            # same text says them; the last one's arguments are incomplete JSON.
            named: dict[int, str] = {}
            arguments: dict[int, str] = {}
            for index, name, more in ToolArrayScanner().feed(text):
                if name is not None:
                    named[index] = name
                arguments[index] = arguments.get(index, "") + more
            return None, [ToolCall(id=tool_call_id(), function=FunctionCall(
                name=name, arguments=escaped(arguments.get(i, "")))) for i, name in sorted(named.items())]

    def feed(self, delta: str) -> list[DeltaToolCall]:
        out = []
        for index, name, arguments in self.scanner.feed(delta):
            if name is not None:
                self.ids.append(tool_call_id())
                self.escapers.append(JsonEscaper())
                out.append(DeltaToolCall(index=index, id=self.ids[index], type="function",
                                         function=DeltaFunctionCall(name=name, arguments="")))
            if arguments:
                out.append(DeltaToolCall(index=index, function=DeltaFunctionCall(
                    arguments=self.escapers[index].feed(arguments))))
        return out
