"""Tool calls on chat: `tool_choice` decides how the output is constrained and how it is read back.

`required` and a named tool constrain the output with a JSON schema built from the tools (vLLM's
structured outputs), so they work with any model: a named tool's output is its arguments; a
required choice's output is `[{"name": ..., "parameters": {...}}, ...]`. `auto` needs a vLLM tool
parser (CHOIR_TOOL_PARSER), which reads calls out of free text (choir/engine/parsing.py).
"""

import json
from dataclasses import dataclass
from typing import Any, Literal

from msgspec import UNSET

from choir.app.serving.json_text import JsonEscaper, escaped
from choir.app.serving.tool_stream import ToolArrayScanner
from choir.core.errors import bad_request
from choir.core.protocol.chat import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    NamedToolChoice,
    ToolCall,
)
from choir.engine.parsing import tool_call_id

EMPTY_OBJECT = {"type": "object", "properties": {}}


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
    # A forced call is the whole answer: a response_format beside it has no text to shape. With `auto` the
    # model calls a tool or answers in the format (choir/app/serving/structured.py, calls_or_format).
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
    """One schema for a list of calls. A tool's `$ref`s point into its own parameters schema (pydantic
    writes `#/$defs/Model`); nested in the list they would point into the list's schema, so such a
    tool's parameters move to the list's `$defs`, under the tool's name, and its `$ref`s follow them."""
    definitions: dict[str, Any] = {}
    calls = []
    for name, schema in parameters.items():
        if _has_refs(schema):
            definitions[name] = _rebased(schema, f"#/$defs/{name}")  # tool names need no pointer escaping
            schema = {"$ref": f"#/$defs/{name}"}
        calls.append({"type": "object", "properties": {"name": {"const": name}, "parameters": schema},
                      "required": ["name", "parameters"], "additionalProperties": False})
    combined: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if parallel is False:  # only an explicit false limits the calls to one
        combined["maxItems"] = 1
    if definitions:
        combined["$defs"] = definitions
    return combined


def _has_refs(node: Any) -> bool:
    if isinstance(node, dict):
        return isinstance(node.get("$ref"), str) or any(_has_refs(value) for value in node.values())
    return isinstance(node, list) and any(_has_refs(value) for value in node)


def _rebased(node: Any, base: str) -> Any:
    """`node` with each local `$ref` (`#`, `#/...`) made relative to `base` instead of the document root."""
    if isinstance(node, dict):
        return {key: base + value[1:] if key == "$ref" and isinstance(value, str) and value.startswith("#")
                else _rebased(value, base) for key, value in node.items()}
    if isinstance(node, list):
        return [_rebased(value, base) for value in node]
    return node


def _builtins(function: Any) -> dict[str, Any]:
    return {k: v for k, v in {"name": function.name, "description": function.description,
                              "parameters": function.parameters}.items() if v is not None}


class NamedToolReader:
    """A forced tool: the whole output is the call's arguments (as strict JSON: choir/app/serving/json_text.py);
    `content` is "". An output cut before its arguments began is no call at all (as OpenAI and vLLM)."""

    def __init__(self, function: str) -> None:
        self.function, self.id, self.started = function, tool_call_id(), False
        self.escaper = JsonEscaper()

    def complete(self, text: str) -> tuple[str | None, list[ToolCall]]:
        if not text:
            return "", []
        return "", [ToolCall(id=self.id, function=FunctionCall(name=self.function, arguments=escaped(text)))]

    def feed(self, delta: str) -> list[DeltaToolCall]:
        """One entry per chunk, as OpenAI sends: the first also has the call's id and name."""
        if not delta:
            return []
        arguments = self.escaper.feed(delta)
        if not self.started:
            self.started = True
            return [DeltaToolCall(index=0, id=self.id, type="function",
                                  function=DeltaFunctionCall(name=self.function, arguments=arguments))]
        return [DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=arguments))]


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
        """One entry per call and chunk: a call's first also has its id and name."""
        out = []
        for index, name, arguments in self.scanner.feed(delta):
            if name is not None:
                self.ids.append(tool_call_id())
                self.escapers.append(JsonEscaper())
            text = self.escapers[index].feed(arguments) if arguments else ""
            if name is not None:
                out.append(DeltaToolCall(index=index, id=self.ids[index], type="function",
                                         function=DeltaFunctionCall(name=name, arguments=text)))
            elif text:
                out.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=text)))
        return out


def one_entry_per_call(calls: list[DeltaToolCall]) -> list[DeltaToolCall]:
    """A chunk's tool-call deltas with one entry per index, as OpenAI sends them (clients such as
    instructor read only the first entry of an index): the entries of an index merged, in order."""
    if len({call.index for call in calls}) == len(calls):
        return calls
    merged: dict[int, DeltaToolCall] = {}
    for call in calls:
        entry = merged.get(call.index)
        if entry is None:
            merged[call.index] = DeltaToolCall(index=call.index, id=call.id, type=call.type, function=call.function)
            continue
        if entry.id is UNSET:
            entry.id, entry.type = call.id, call.type
        entry.function = _joined(entry.function, call.function)
    return list(merged.values())


def _joined(first: Any, second: Any) -> Any:
    if first is UNSET:
        return second
    if second is UNSET:
        return first
    name = first.name if first.name is not UNSET else second.name
    arguments = (first.arguments or "") + (second.arguments or "") if (
        first.arguments is not UNSET or second.arguments is not UNSET) else UNSET
    return DeltaFunctionCall(name=name, arguments=arguments)
