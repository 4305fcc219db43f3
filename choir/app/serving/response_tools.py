"""The Responses API's tools as chat tools, and the model's chat tool calls as Responses output items.

- A function tool is a chat function.
- A namespace tool's functions are chat functions named `{namespace}__{name}` (as vLLM's server names them); their
  calls come back as `function_call` items with `name` and `namespace` apart, which is how clients (Codex) find
  the function to run.
- A custom (freeform) tool is a chat function of one string argument, `input` (as vLLM's server offers it); its
  calls come back as `custom_tool_call` items carrying that text.
- A hosted tool (web_search, file_search, ...) is not offered: Choir hosts none.
The same names take calls sent back in `input` to the chat messages the template renders.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jiter

from choir.core.errors import bad_request
from choir.core.protocol.responses import (
    CustomTool,
    CustomToolCallOutput,
    FunctionCallOutput,
    FunctionTool,
    FunctionToolChoice,
    ItemStatus,
    NamespaceTool,
    Tool,
)

SEPARATOR = "__"  # between a namespace and a function's name, in the name the model sees
MAX_NAME = 64  # a chat function's name
CUSTOM_INPUT = {"type": "object", "properties": {"input": {"type": "string", "description": "The tool's input."}},
                "required": ["input"]}


@dataclass(frozen=True, slots=True)
class Offered:
    """A tool the model may call, under the name it sees."""

    name: str
    namespace: str | None
    custom: bool


def flat_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


def _callable_members(tools: list[Tool] | None) -> Iterator[tuple[str, str, str | None, FunctionTool | CustomTool]]:
    """Each tool the model may call: where it is in `tools`, the name the model sees, its namespace, the tool."""
    for i, tool in enumerate(tools or ()):
        members = tool.tools if isinstance(tool, NamespaceTool) else [tool]
        namespace = tool.name if isinstance(tool, NamespaceTool) else None
        for j, member in enumerate(members):
            if isinstance(member, FunctionTool | CustomTool):
                yield (f"tools[{i}].tools[{j}]" if namespace else f"tools[{i}]", flat_name(member.name, namespace),
                       namespace, member)


def callables(tools: list[Tool] | None) -> dict[str, Offered]:
    """Each tool the model may call, by the name it sees."""
    return {name: Offered(member.name, namespace, isinstance(member, CustomTool))
            for _, name, namespace, member in _callable_members(tools)}


def chat_tools(tools: list[Tool] | None) -> list[dict[str, Any]]:
    """The chat functions the model is offered; a 400 naming the tool whose name, as the model sees it, is too
    long or is another tool's too."""
    offered: list[dict[str, Any]] = []
    seen: set[str] = set()
    for where, name, _, member in _callable_members(tools):
        if len(name) > MAX_NAME:
            raise bad_request(f"The tool `{name}` (its namespace, `{SEPARATOR}`, its name) is longer than "
                              f"{MAX_NAME} characters, the longest name a model is offered.", f"{where}.name")
        if name in seen:
            raise bad_request(f"Two tools are offered to the model as `{name}`: name them apart.", f"{where}.name")
        seen.add(name)
        if isinstance(member, FunctionTool):
            function = {"name": name, "description": member.description, "parameters": member.parameters,
                        "strict": member.strict}
        else:
            function = {"name": name, "description": _custom_description(member), "parameters": CUSTOM_INPUT}
        offered.append({"type": "function", "function": function})
    return offered


def _custom_description(tool: CustomTool) -> str | None:
    grammar = tool.format if tool.format and tool.format.get("type") == "grammar" else None
    if grammar is None:
        return tool.description
    rule = f"Its input follows this {grammar.get('syntax', '')} grammar:\n{grammar.get('definition', '')}"
    return f"{tool.description}\n\n{rule}" if tool.description else rule


def chat_tool_choice(choice: FunctionToolChoice, names: dict[str, Offered]) -> dict[str, Any]:
    name = flat_name(choice.name, choice.namespace)
    known = names.get(name)
    if known is None or known.custom != (choice.type == "custom"):
        raise bad_request(f"tool_choice names the {choice.type} tool `{name}`, which `tools` does not offer.",
                          "tool_choice")
    return {"type": "function", "function": {"name": name}}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: ItemStatus,
              names: dict[str, Offered]) -> FunctionCallOutput | CustomToolCallOutput:
    """A chat tool call as the Responses output item of the tool it calls (`status` incomplete: its arguments
    were cut short by the output limit)."""
    called = names.get(name)
    if called is None:  # a name the model made up: said as it is
        return FunctionCallOutput(id=item_id, call_id=call_id, name=name, arguments=arguments, status=status)
    item: FunctionCallOutput | CustomToolCallOutput
    if called.custom:
        item = CustomToolCallOutput(id=item_id.replace("fc_", "ctc_", 1), call_id=call_id, name=called.name,
                                    input=custom_input(arguments), status=status)
    else:
        item = FunctionCallOutput(id=item_id, call_id=call_id, name=called.name, arguments=arguments, status=status)
    if called.namespace is not None:
        item.namespace = called.namespace
    return item


def custom_input(arguments: str) -> str:
    """The text of a custom tool's call: its `input` argument, as far as it goes when the arguments were cut
    short (the arguments as they are when they are not the one-string object the tool was offered as)."""
    try:
        decoded = jiter.from_json(arguments.encode(), partial_mode="trailing-strings")
    except ValueError:
        return arguments
    return decoded["input"] if isinstance(decoded, dict) and isinstance(decoded.get("input"), str) else arguments


def custom_arguments(text: str) -> str:
    """A custom tool call's text sent back in `input`, as the arguments the model gave."""
    return json.dumps({"input": text}, ensure_ascii=False)
