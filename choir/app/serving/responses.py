"""POST /v1/responses: the Responses API over the chat pipeline.

A Responses request is translated into a chat request (messages, tools, response format) and
planned and run as one; its single choice is then told as a `response` object with output items,
or streamed as the Responses lifecycle events.
"""

import zlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import Any

import msgspec

from choir.app.serving import reasoning_blob
from choir.app.serving.chat import ChatJob, choice_logprobs, plan_chat
from choir.app.serving.counts import TokenCounts
from choir.app.serving.response_events import Event, ResponseBuilder
from choir.app.serving.response_tools import callables, chat_tool_choice, chat_tools, custom_arguments, flat_name
from choir.app.serving.streaming import Outbox, named_frame
from choir.core.errors import APIError, PromptTooLong, bad_request
from choir.core.protocol import parse_strict
from choir.core.protocol.chat import ChatCompletionRequest, JsonSchemaFormat
from choir.core.protocol.responses import (
    CustomToolCallInput,
    CustomToolCallOutputInput,
    FunctionCallInput,
    FunctionCallOutputInput,
    InputAudio,
    InputImage,
    InputMessage,
    JsonSchemaTextFormat,
    LocalShellCallInput,
    LocalShellCallOutputInput,
    ReasoningInput,
    Response,
    ResponsesRequest,
    ToolOutputPart,
)
from choir.plugins.aggregation import Aggregator, cached_tokens
from choir.plugins.media import ImageRefused
from choir.plugins.pipeline import Pipeline

LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for them
_ITEM_TYPES = {"message": InputMessage, "function_call": FunctionCallInput,
               "function_call_output": FunctionCallOutputInput, "reasoning": ReasoningInput,
               "custom_tool_call": CustomToolCallInput, "custom_tool_call_output": CustomToolCallOutputInput,
               "local_shell_call": LocalShellCallInput, "local_shell_call_output": LocalShellCallOutputInput}
_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")
# The chat fields a Responses request sets, by their Responses names: an error about one names the
# field the client sent.
_RESPONSES_NAMES = {"max_completion_tokens": "max_output_tokens", "response_format": "text.format",
                    "response_format.json_schema.schema": "text.format.schema", "messages": "input",
                    "reasoning_effort": "reasoning.effort"}


def to_chat(request: ResponsesRequest, history: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
    """`history`: the stored items the request continues (a previous response's chain, or a conversation's);
    None: there is no store to read them from."""
    if request.previous_response_id is not None and history is None:
        raise bad_request("previous_response_id needs the response store, and this server runs without one "
                          "(CHOIR_STORE=off): send the whole conversation in `input`.", "previous_response_id")
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    messages = [*system, *messages_of(history or [], "input"), *turn_messages(request)]
    if not messages:
        raise bad_request("input must not be empty.", "input")
    # A background response is made as a stream whether or not a client follows it: its events are stored.
    body: dict[str, Any] = {"messages": messages, "stream": request.stream or request.background,
                            "model": request.model,
                            "max_completion_tokens": request.max_output_tokens, "temperature": request.temperature,
                            "top_p": request.top_p, "parallel_tool_calls": request.parallel_tool_calls,
                            "user": request.user, "include_reasoning": request.include_reasoning,
                            "reasoning_effort": request.reasoning.effort if request.reasoning else None,
                            "chat_template_kwargs": request.chat_template_kwargs}
    if LOGPROBS in (request.include or ()):
        body["logprobs"], body["top_logprobs"] = True, request.top_logprobs
    offered = chat_tools(request.tools)  # hosted tools (web_search, ...) are not offered: Choir hosts none
    if offered:
        body["tools"] = offered
    choice = request.tool_choice
    if choice == "auto" and not offered:
        choice = None  # OpenAI's default, whether or not there are tools
    body["tool_choice"] = chat_tool_choice(choice, callables(request.tools)) \
        if isinstance(choice, msgspec.Struct) else choice
    chat = parse_strict({k: v for k, v in body.items() if v is not None}, ChatCompletionRequest)
    text_format = request.text.format if request.text else None
    if isinstance(text_format, JsonSchemaTextFormat):
        chat.response_format = JsonSchemaFormat(json_schema=text_format.as_chat())
    elif text_format is not None:
        chat.response_format = text_format
    return chat


def turn_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """This request's input as chat messages."""
    if isinstance(request.input, str):
        return [{"role": "user", "content": request.input}]
    return messages_of(request.input, "input")


def messages_of(items: list[dict[str, Any]], param: str) -> list[dict[str, Any]]:
    """Input items (or stored ones) as chat messages: reasoning items go to the assistant turn they belong to.
    `param`: the field an invalid item is named in."""
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # reasoning waiting for the assistant turn that follows it
    room = [reasoning_blob.MAX_TEXT]  # what the items' encrypted reasoning may still expand to
    for index, item in enumerate(items):
        message = _message(f"{param}[{index}]", item, room)
        if "reasoning" in message:
            previous = messages[-1] if messages else None
            if previous is not None and previous["role"] == "assistant" and "reasoning" not in previous:
                previous["reasoning"] = message["reasoning"]  # the reasoning of the turn just sent
            else:
                reasoning = message["reasoning"]
            continue
        if reasoning is not None and message["role"] == "assistant":
            message["reasoning"], reasoning = reasoning, None
        messages.append(message)
    if reasoning is not None:  # reasoning last: an assistant turn of reasoning alone
        messages.append({"role": "assistant", "content": "", "reasoning": reasoning})
    return messages


def _message(where: str, item: dict[str, Any], room: list[int]) -> dict[str, Any]:
    kind = item.get("type", "message")
    if not isinstance(kind, str) or kind not in _ITEM_TYPES:
        raise bad_request(f"{where}: item type `{kind}` is not supported: use {', '.join(_ITEM_TYPES)}.",
                          f"{where}.type")
    try:
        parsed = msgspec.convert({**item, "type": kind}, _ITEM_TYPES[kind], strict=True)
    except msgspec.ValidationError as exc:
        raise bad_request(f"Invalid item {where}: {exc}", where) from None
    if isinstance(parsed, ReasoningInput):
        return {"role": "assistant", "reasoning": _reasoning(where, parsed, room)}
    if isinstance(parsed, FunctionCallInput | CustomToolCallInput | LocalShellCallInput):
        return {"role": "assistant", "content": None, "tool_calls": [_tool_call(parsed)]}
    if isinstance(parsed, FunctionCallOutputInput | CustomToolCallOutputInput):
        return {"role": "tool", "tool_call_id": parsed.call_id, "content": _tool_output(where, parsed.output)}
    if isinstance(parsed, LocalShellCallOutputInput):
        return {"role": "tool", "tool_call_id": parsed.id, "content": parsed.output}
    if isinstance(parsed.content, str):
        return {"role": parsed.role, "content": parsed.content}
    if not any(isinstance(part, InputImage | InputAudio) for part in parsed.content):
        return {"role": parsed.role, "content": "".join(part.text for part in parsed.content)}
    return {"role": parsed.role, "content": _chat_parts(f"{where}.content", parsed.content)}


def _chat_parts(where: str, parts: list[Any]) -> list[dict[str, Any]]:
    chat_parts: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        if isinstance(part, InputAudio):
            chat_parts.append({"type": "input_audio", "input_audio": msgspec.to_builtins(part.input_audio)})
        elif not isinstance(part, InputImage):
            chat_parts.append({"type": "text", "text": part.text})
        elif part.image_url is None:
            raise bad_request("An image by `file_id` needs a Files API, which this server has not: send `image_url` "
                              "(a data URL, or an http(s) URL).", f"{where}[{j}]")
        else:
            chat_parts.append({"type": "image_url", "image_url": {"url": part.image_url}})
    return chat_parts


def _reasoning(where: str, item: ReasoningInput, room: list[int]) -> str:
    """The reasoning's text: its content (or summary), else what Choir put in its `encrypted_content` (within
    what `room` says the request's blobs may still expand to)."""
    parts = item.content or item.summary
    if parts:
        return "".join(part.text for part in parts)
    if not item.encrypted_content:
        return ""
    text = reasoning_blob.decode(item.encrypted_content, room[0])
    if text is not None:
        room[0] -= len(text.encode())
    else:
        raise bad_request(f"{where}: this server cannot read the item's encrypted_content: it was not made here, is "
                          "damaged, or holds more reasoning than one request may send back (8 MiB). Send the "
                          "reasoning's text in `content`, or leave the item out.",
                          f"{where}.encrypted_content")
    return text


def _tool_call(item: FunctionCallInput | CustomToolCallInput | LocalShellCallInput) -> dict[str, Any]:
    """An earlier call, as the chat tool call the model made (under the name it was offered)."""
    if isinstance(item, FunctionCallInput):
        name, arguments = flat_name(item.name, item.namespace), item.arguments
    elif isinstance(item, CustomToolCallInput):
        name, arguments = flat_name(item.name, item.namespace), custom_arguments(item.input)
    else:
        name, arguments = "local_shell", msgspec.json.encode(item.action).decode()
    call_id = item.call_id if not isinstance(item, LocalShellCallInput) else (item.call_id or item.id or "")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_output(where: str, output: str | list[ToolOutputPart]) -> str | list[dict[str, Any]]:
    """A tool's result: text, or its parts (images for a vision-language model)."""
    if isinstance(output, str):
        return output
    if not any(isinstance(part, InputImage) for part in output):
        return "".join(part.text for part in output if not isinstance(part, InputImage))
    return _chat_parts(f"{where}.output", output)


def part_names(request: ResponsesRequest, history: list[dict[str, Any]] | None, part_type: str) -> list[str]:
    """Where each part of `part_type` (`input_image`, `input_audio`) of the chat messages came from, in their
    order: the stored history, then `input`."""
    stored = "conversation" if request.conversation is not None else "previous_response_id"
    names = [stored for item in history or () for _ in _parts(item, part_type)]
    if not isinstance(request.input, str):
        names += [f"input[{i}].{field}[{j}]" for i, item in enumerate(request.input)
                  for field, j in _parts(item, part_type)]
    return names


def _parts(item: Any, part_type: str) -> list[tuple[str, int]]:
    """Where a message's (or a tool output's) parts of `part_type` are: (its field, each one's index)."""
    if not isinstance(item, dict):
        return []
    kind = item.get("type", "message")
    field = "content" if kind == "message" else "output" if kind in _TOOL_OUTPUTS else None
    parts = item.get(field) if field is not None else None
    if field is None or not isinstance(parts, list):
        return []
    return [(field, j) for j, part in enumerate(parts) if isinstance(part, dict) and part.get("type") == part_type]


async def plan_response(pipeline: Pipeline, request: ResponsesRequest, response_id: str, created: int,
                        history: list[dict[str, Any]] | None = None,
                        store: bool = False) -> tuple[ChatJob, ResponseBuilder]:
    """`history`: the stored items the request continues. Past the context, `truncation: "auto"` drops the
    oldest turns of it (whole turns, each from a user message on), the fewest that make it fit."""
    try:
        try:
            job = await _plan_fitting(pipeline, request, history, response_id, created)
        except PromptTooLong:
            if not history or request.truncation != "auto":
                raise
            job = await _truncated(pipeline, request, history, response_id, created)
    except PromptTooLong as exc:
        if history and exc.param == "messages":
            where = "conversation" if request.conversation is not None else "previous_response_id"
            raise bad_request(f"{exc.message} The conversation {where} continues is too long for the model: "
                              "start a new one, send a shorter input, or set `truncation` to \"auto\".", where) \
                from None
        raise _in_responses_terms(exc) from None
    except APIError as exc:
        raise _in_responses_terms(exc) from None
    return job, ResponseBuilder(job, request, store)


async def _plan_fitting(pipeline: Pipeline, request: ResponsesRequest, history: list[dict[str, Any]] | None,
                        response_id: str, created: int) -> ChatJob:
    """Planned; under `truncation: "auto"` a history fits only if it leaves room for `max_output_tokens` too, as
    OpenAI reserves the output before it cuts (else a cut history could leave room for one token)."""
    job = await plan_chat(pipeline, to_chat(request, history), response_id, created,
                          part_names(request, history, "input_image"), part_names(request, history, "input_audio"))
    ranks = pipeline.engine.data_parallel_size
    if request.prompt_cache_key is not None and ranks > 1:
        # One conversation's turns on one engine rank: the one whose prefix cache holds what they share
        rank = zlib.crc32(request.prompt_cache_key.encode()) % ranks
        job.choices[:] = [replace(choice, options=msgspec.structs.replace(choice.options, data_parallel_rank=rank))
                          for choice in job.choices]
    room = pipeline.engine.max_model_len - job.prompt_tokens
    if history and request.truncation == "auto" and request.max_output_tokens and room < request.max_output_tokens:
        raise PromptTooLong(f"The prompt leaves {room} tokens for output, fewer than max_output_tokens.", "messages")
    return job


async def _truncated(pipeline: Pipeline, request: ResponsesRequest, history: list[dict[str, Any]],
                     response_id: str, created: int) -> ChatJob:
    """A binary search over where the kept history may start: each try renders the prompt once."""
    starts = [index for index, item in enumerate(history)
              if index and item.get("type", "message") == "message" and item.get("role") == "user"]
    starts.append(len(history))  # the whole history dropped: the new input alone
    low, high, fits = 0, len(starts) - 1, None
    while low <= high:
        middle = (low + high) // 2
        try:
            job = await _plan_fitting(pipeline, request, history[starts[middle]:], response_id, created)
        except PromptTooLong:
            low = middle + 1
            continue
        fits, high = job, middle - 1
    if fits is None:
        raise PromptTooLong("The input alone is too long for the model, with every earlier turn dropped.",
                            "input")
    return fits


def _in_responses_terms(error: APIError) -> APIError:
    """An error about a chat field the request set, told with the Responses field's name."""
    if isinstance(error, ImageRefused):  # named where the image is already
        return error
    param = error.param or ""
    name = _RESPONSES_NAMES.get(param) or _RESPONSES_NAMES.get(param.split("[")[0].split(".")[0])
    if name is None:
        return error
    message = error.message
    for chat_name in ("max_completion_tokens", "response_format", "messages", "reasoning_effort"):
        message = message.replace(chat_name, _RESPONSES_NAMES[chat_name])
    return error.renamed(name, message)


async def respond(aggregator: Aggregator, job: ChatJob, builder: ResponseBuilder, counts: TokenCounts) -> Response:
    [output] = await aggregator.collect(job.choices)
    completion = output.outputs[0]
    reader = job.output()
    parts = reader.whole(completion.text)
    counts.completion_tokens = len(completion.token_ids)
    logprobs = choice_logprobs(job, completion) if job.shows_tokens(reader) else None
    return builder.final(parts, completion.finish_reason, len(completion.token_ids),
                         reader.reasoning_tokens(list(completion.token_ids), reader.read_reasoning),
                         cached_tokens(job.choices, [output.num_cached_tokens]),
                         logprobs.content if logprobs else None)


async def response_events(aggregator: Aggregator, job: ChatJob, builder: ResponseBuilder, counts: TokenCounts,
                          on_close: Callable[[Response], Awaitable[None]] | None = None
                          ) -> AsyncGenerator[tuple[list[Event], int], None]:
    """The lifecycle events of each engine output, with how many choices it finished. `on_close` gets the
    response as it ended before its closing events are yielded (a client that reads them may continue it
    at once)."""
    reader = job.output()
    tokens: list[int] = []
    started, cached = False, None
    async with aclosing(aggregator.merge(job.choices)) as batches:
        async for batch in batches:
            events = [] if started else builder.start()  # created and in_progress wait for the first output
            if not started:
                [(choice, first)] = batch
                cached = cached_tokens([choice], [first.num_cached_tokens])
            started, finished = True, 0
            for _, output in batch:
                completion = output.outputs[0]
                tokens += completion.token_ids
                finished += output.finished
                parts = reader.delta(completion.text, list(completion.token_ids), completion.finish_reason is not None)
                logprobs = choice_logprobs(job, completion) if job.shows_tokens(reader) else None
                events += builder.add(parts, logprobs.content if logprobs else None)
                if completion.finish_reason is not None:
                    counts.completion_tokens = len(tokens)
                    events += builder.finish(completion.finish_reason, len(tokens), reader.streamed_reasoning_tokens(),
                                             cached)
                    if on_close is not None and builder.closed is not None:
                        await on_close(builder.closed)
            yield events, finished


async def stream_response(aggregator: Aggregator, job: ChatJob, builder: ResponseBuilder, counts: TokenCounts,
                          on_close: Callable[[Response], Awaitable[None]] | None = None
                          ) -> AsyncGenerator[bytes, None]:
    """The lifecycle events as SSE frames, those of one engine output together; the closing ones end the stream."""
    outbox = Outbox(len(job.choices))
    async with aclosing(response_events(aggregator, job, builder, counts, on_close)) as batches:
        async for events, finished in batches:
            if item := outbox.send([named_frame(*event) for event in events], finished):
                yield item
    yield outbox.close()
