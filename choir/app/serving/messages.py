"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat pipeline.

A Messages request is translated into a chat request and planned and run as one (choir/app/serving/chat.py):
`system` and the conversation become chat messages (`tool_use` blocks an assistant's tool calls,
`tool_result` blocks tool messages before the user's text, `thinking` the assistant's reasoning), a final
assistant turn is continued (a prefill), `tools`/`tool_choice` become chat's (`any` is `required`: forced
calls are constrained alike), `thinking` the template's `enable_thinking` and vLLM's thinking budget. Its one
choice is told as a Message, or as Anthropic's stream events (choir/app/serving/message_events.py).
"""

from typing import Any

import msgspec

from choir.app.errors import error_for
from choir.app.serving.chat import ChatJob, plan_chat
from choir.app.serving.message_events import MessageBuilder
from choir.core.errors import APIError, EngineRejected, PromptTooLong, bad_request
from choir.core.protocol import parse_strict
from choir.core.protocol.chat import ChatCompletionRequest
from choir.core.protocol.messages import (
    MessagesInput,
    MessagesRequest,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
    ToolChoiceTool,
)
from choir.plugins.media import ImageRefused
from choir.plugins.pipeline import Pipeline

BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's per-conversation system block: noise to the model
ROLES = ("user", "assistant", "system")
# The block types each role may send, and what Choir does not serve (the message says what to send).
_BLOCKS = {"user": ("text", "image", "tool_result"), "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
           "system": ("text",)}
_NOT_SERVED = {
    "document": "`document` blocks are not served: send the document's text in a `text` block.",
    "search_result": "`search_result` blocks are not served: send the result's text in a `text` block.",
    "container_upload": "`container_upload` blocks are not served: this server runs no code-execution container.",
}
# Chat fields by the Messages field they came from: an error about one names the field the client sent.
_FIELDS = {"stop": "stop_sequences", "response_format": "output_config.format", "reasoning_effort":
           "output_config.effort", "thinking_token_budget": "thinking.budget_tokens", "user": "metadata.user_id"}


def to_chat(request: MessagesInput, max_tokens: int, stream: bool = False,
            fold_system: bool = False) -> tuple[ChatCompletionRequest, list[str]]:
    """The chat request, and where each of its images came from. `fold_system`: inline `system` turns join the
    leading system message (for a chat template that takes a system message only first)."""
    conversation, prefill, images = _conversation(request)
    messages = [*_system(request), *conversation]
    if fold_system:
        messages = _folded(messages)
    body: dict[str, Any] = {"model": request.model, "messages": messages, "max_tokens": max_tokens,
                            "stream": stream, "add_generation_prompt": not prefill,
                            "continue_final_message": prefill}
    if isinstance(request, MessagesRequest):
        body.update(temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
                    stop=request.stop_sequences, user=request.metadata.user_id if request.metadata else None)
    body.update(_tools(request))
    body.update(_thinking(request))
    output = request.output_config
    if output is not None and output.format is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output",
                                                                          "schema": output.format.schema}}
    if output is not None and output.effort is not None:
        body["reasoning_effort"] = output.effort
    try:
        return parse_strict({k: v for k, v in body.items() if v is not None}, ChatCompletionRequest), images
    except msgspec.ValidationError as exc:
        raise in_messages_terms(error_for(exc)) from None


def _system(request: MessagesInput) -> list[dict[str, Any]]:
    system = request.system
    if isinstance(system, list):
        system = "\n".join(block.text for block in system if not block.text.startswith(BILLING_HEADER))
    return [{"role": "system", "content": system}] if system else []


def _conversation(request: MessagesInput) -> tuple[list[dict[str, Any]], bool, list[str]]:
    """The messages as chat messages, whether the last is a prefill (an assistant turn without tool calls,
    which the answer continues), and where each image came from (in the chat messages' order)."""
    if not request.messages:
        raise bad_request("At least one message is required.", "messages")
    messages: list[dict[str, Any]] = []
    images: list[str] = []
    for i, message in enumerate(request.messages):
        where = f"messages[{i}]"
        if message.role not in ROLES:
            raise bad_request(f"Invalid role `{message.role}`: a message's role is one of {', '.join(ROLES)}.",
                              f"{where}.role")
        blocks = [{"type": "text", "text": message.content}] if isinstance(message.content, str) \
            else message.content
        messages += _turn(message.role, blocks, where, images)
    last, final = request.messages[-1], messages[-1]
    prefill = last.role == "assistant" and "tool_calls" not in final
    if prefill and final["content"] != final["content"].rstrip():
        raise bad_request("The final assistant content (a prefill the answer continues) cannot end with "
                          "whitespace.", f"messages[{len(request.messages) - 1}].content")
    return messages, prefill, images


def _turn(role: str, blocks: list[dict[str, Any]], where: str, images: list[str]) -> list[dict[str, Any]]:
    """One turn's blocks as chat messages: a user's tool results come first, each a tool message; images (a tool
    result's, then the turn's own) join the user's message, their names appended to `images` in that order."""
    parts: list[Any] = []  # the turn's texts (str) and images (chat image parts), in order
    result_parts: list[Any] = []  # the tool results' images, in order: before the turn's own content
    own_images: list[str] = []
    before = len(images)
    results: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in _NOT_SERVED:
            raise bad_request(_NOT_SERVED[kind], at)
        if kind not in _BLOCKS[role]:
            allowed = ", ".join(f"`{name}`" for name in _BLOCKS[role])
            raise bad_request(f"A {role} message's content blocks are {allowed}, not `{kind}`.", f"{at}.type")
        if kind == "text":
            parts.append(_field(block, "text", str, at))
        elif kind == "image":
            parts.append(_image(block, at))
            own_images.append(at)
        elif kind == "tool_result":
            text, result_images = _result(block, at)
            results.append({"role": "tool", "tool_call_id": _field(block, "tool_use_id", str, at), "content": text})
            result_parts += [part for part, _ in result_images]
            images += [name for _, name in result_images]
        elif kind == "tool_use":
            arguments = msgspec.json.encode(_field(block, "input", dict, at)).decode()
            calls.append({"id": _field(block, "id", str, at), "type": "function",
                          "function": {"name": _field(block, "name", str, at), "arguments": arguments}})
        elif kind == "thinking":
            reasoning.append(_field(block, "thinking", str, at))  # its signature is not checked
    images += own_images
    if result_parts:
        parts = result_parts + parts
    messages = results
    if parts or calls or reasoning or not results:
        content = _with_images(parts) if len(images) > before else "\n".join(parts)
        message: dict[str, Any] = {"role": role, "content": content}
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message["reasoning"] = "".join(reasoning)
        messages = [*messages, message]
    return messages


def _with_images(parts: list[Any]) -> list[dict[str, Any]]:
    """Texts and images as chat content parts, in order; adjacent texts joined by newlines, as without images."""
    content: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, str) and content and content[-1]["type"] == "text":
            content[-1] = {"type": "text", "text": content[-1]["text"] + "\n" + part}
        else:
            content.append({"type": "text", "text": part} if isinstance(part, str) else part)
    return content


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An `image` block as chat's image part: a base64 source as a data URL, a url source as it is."""
    source = _field(block, "source", dict, where)
    kind = source.get("type")
    if kind == "base64":
        media_type = _field(source, "media_type", str, f"{where}.source")
        url = f"data:{media_type};base64,{_field(source, 'data', str, f'{where}.source')}"
    elif kind == "url":
        url = _field(source, "url", str, f"{where}.source")
    elif kind == "file":
        raise bad_request("An image by `file_id` needs the Files API, which this server has not: send a `base64` "
                          "or `url` source.", f"{where}.source")
    else:
        raise bad_request("An image's `source.type` is `base64` or `url`.", f"{where}.source.type")
    return {"type": "image_url", "image_url": {"url": url}}


def _field(block: dict[str, Any], name: str, kind: type, where: str) -> Any:
    value = block.get(name)
    if not isinstance(value, kind):
        raise bad_request(f"`{name}` must be {'an object' if kind is dict else 'a string'}.", f"{where}.{name}")
    return value


def _result(block: dict[str, Any], where: str) -> tuple[str, list[tuple[dict[str, Any], str]]]:
    """A tool result's content (a string, or text and image blocks): its text, an error result saying so first,
    and its images with their names (chat's tool messages hold text only)."""
    content = block.get("content")
    images: list[tuple[dict[str, Any], str]] = []
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            at = f"{where}.content[{k}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image":
                images.append((_image(part, at), at))
                continue
            if kind in _NOT_SERVED:
                raise bad_request(_NOT_SERVED[kind], at)
            if kind != "text":
                raise bad_request(f"A tool result's content blocks are `text` and `image`, not `{kind}`.",
                                  f"{at}.type")
            parts.append(_field(part, "text", str, at))
        text = "\n".join(parts)
    else:
        raise bad_request("`content` must be a string or a list of text and image blocks.", f"{where}.content")
    return (f"Error: {text}" if block.get("is_error") is True else text), images


def _folded(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    system = [m["content"] for m in messages if m["role"] == "system" and m["content"]]
    rest = [m for m in messages if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(system)}, *rest] if system else rest


def _tools(request: MessagesInput) -> dict[str, Any]:
    tools = []
    for i, tool in enumerate(request.tools or ()):
        if tool.type not in (None, "custom"):
            raise bad_request(f"`{tool.type}` is one of Anthropic's own tools, which this server does not run: "
                              "give client tools (`name`, `input_schema`) and run them yourself.", f"tools[{i}].type")
        if tool.input_schema is None:
            raise bad_request("A client tool needs an `input_schema`.", f"tools[{i}].input_schema")
        schema = tool.input_schema if "type" in tool.input_schema else {"type": "object", **tool.input_schema}
        tools.append({"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                       "parameters": schema, "strict": tool.strict}})
    choice = request.tool_choice
    fields: dict[str, Any] = {"tools": tools or None}
    if isinstance(choice, ToolChoiceAuto):
        fields["tool_choice"] = "auto"
    elif isinstance(choice, ToolChoiceAny):
        fields["tool_choice"] = "required"
    elif isinstance(choice, ToolChoiceTool):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif isinstance(choice, ToolChoiceNone):
        fields["tool_choice"] = "none"
    if getattr(choice, "disable_parallel_tool_use", False):
        fields["parallel_tool_calls"] = False
    return fields


def _thinking(request: MessagesInput) -> dict[str, Any]:
    thinking = request.thinking
    if thinking is None or thinking.type == "adaptive":  # the model's (its template's) own default
        return {}
    if thinking.type == "disabled":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    if isinstance(request.tool_choice, (ToolChoiceAny, ToolChoiceTool)):
        raise bad_request("Thinking may not be enabled when tool_choice forces tool use.", "thinking")
    budget = thinking.budget_tokens
    if budget is None:
        raise bad_request("`enabled` thinking needs `budget_tokens`.", "thinking.budget_tokens")
    if isinstance(request, MessagesRequest) and budget >= request.max_tokens:
        raise bad_request(f"budget_tokens ({budget}) must be less than max_tokens ({request.max_tokens}).",
                          "thinking.budget_tokens")
    return {"chat_template_kwargs": {"enable_thinking": True}, "thinking_token_budget": budget}


def in_messages_terms(error: APIError) -> APIError:
    """An error about a chat field, told with the Messages field's name (a tool's function.parameters is its
    input_schema; a chat message's index is not the request's, so `messages` alone)."""
    param = error.param
    if param is None or isinstance(error, (PromptTooLong, ImageRefused)):  # the latter named where the image is
        return error
    head = param.split("[")[0].split(".")[0]
    if head == "messages":
        name = "messages"
    elif head == "tools":
        name = param.replace(".function.parameters", ".input_schema").replace(".function", "")
    else:
        name = _FIELDS.get(head, param)
    if name == param:
        return error
    message = error.message.replace(f"`{param}`", f"`{name}`")
    for chat_name, ours in _FIELDS.items():
        message = message.replace(f"`{chat_name}`", f"`{ours}`")
    return error.renamed(name, message)


def check_model(pipeline: Pipeline, model: str) -> None:
    """A name this server does not serve is a 404, as Anthropic answers an unknown model."""
    engine = pipeline.engine
    if model not in engine.served_model_names and model not in engine.adapters:
        raise APIError(404, f"`{model}` is not served here; the served models: "
                            f"{', '.join((*engine.served_model_names, *engine.adapters))}.", "model")


async def plan_message(pipeline: Pipeline, request: MessagesRequest, message_id: str,
                       created: int) -> tuple[ChatJob, MessageBuilder]:
    job = await _plan(pipeline, request, message_id, created, request.max_tokens)
    return job, MessageBuilder(job, request)


async def count_tokens(pipeline: Pipeline, request: MessagesInput, request_id: str, created: int) -> int:
    """The prompt's tokens (system, tools and messages, rendered as an answer would render them)."""
    return (await _plan(pipeline, request, request_id, created, 1)).prompt_tokens


async def _plan(pipeline: Pipeline, request: MessagesInput, request_id: str, created: int,
                max_tokens: int) -> ChatJob:
    """A chat request planned for the Messages request. `max_tokens` above the context's room is cut to it (Claude
    Code asks for tens of thousands); the answer then tells `max_tokens` from the context window's end."""
    check_model(pipeline, request.model)
    _check_refused(request)
    budget = min(max_tokens, pipeline.engine.max_model_len)
    stream = isinstance(request, MessagesRequest) and request.stream
    chat, images = to_chat(request, budget, stream)
    if request.tools and not isinstance(request.tool_choice, (ToolChoiceAny, ToolChoiceTool, ToolChoiceNone)) \
            and (pipeline.parsers is None or pipeline.parsers.tool_name is None):
        raise bad_request("Tools with tool_choice `auto` need a tool parser: start the server with CHOIR_TOOL_PARSER "
                          "set (e.g. hermes), or send tool_choice {\"type\": \"any\"} or {\"type\": \"tool\", "
                          "\"name\": ...}.", "tool_choice")
    try:
        try:
            return await plan_chat(pipeline, chat, request_id, created, images)
        except EngineRejected as exc:  # a template that takes a system message only first
            if exc.param != "messages" or not any(m.role == "system" for m in request.messages):
                raise
            folded, images = to_chat(request, budget, stream, fold_system=True)
            return await plan_chat(pipeline, folded, request_id, created, images)
    except PromptTooLong as exc:
        if exc.tokens is None or exc.limit is None:
            raise
        # Anthropic's words, alone (no field before them), which Claude Code reads to compact the conversation
        raise PromptTooLong(f"prompt is too long: {exc.tokens} tokens > {exc.limit - 1} maximum", None,
                            exc.tokens, exc.limit) from None
    except APIError as exc:  # about a chat field: named as the Messages field
        raise in_messages_terms(exc) from None


def _check_refused(request: MessagesInput) -> None:
    if not isinstance(request, MessagesRequest):
        return
    if request.mcp_servers:
        raise bad_request("MCP servers are not served: this server connects to none. Give their tools as client "
                          "`tools` and run them yourself.", "mcp_servers")
    if request.container is not None:
        raise bad_request("Containers are not served: this server runs no code-execution container.", "container")
