"""POST /v1/responses: the Responses API over the chat pipeline.

A Responses request is translated into a chat request (messages, tools, response format) and
planned and run as one; its single choice is then told as a `response` object with output items,
or streamed as the Responses lifecycle events.
"""

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import msgspec

from app.serving.chat import ChatJob, choice_logprobs, plan_chat
from app.serving.counts import TokenCounts
from app.serving.response_events import ResponseBuilder
from app.serving.streaming import Outbox, named_frame
from core.errors import APIError, bad_request
from core.protocol import parse_strict
from core.protocol.chat import ChatCompletionRequest, JsonSchemaFormat
from core.protocol.responses import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputMessage,
    JsonSchemaTextFormat,
    ReasoningInput,
    Response,
    ResponsesRequest,
)
from plugins.aggregation import Aggregator, cached_tokens
from plugins.pipeline import Pipeline

LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for them
_ITEM_TYPES = {"message": InputMessage, "function_call": FunctionCallInput,
               "function_call_output": FunctionCallOutputInput, "reasoning": ReasoningInput}
# The chat fields a Responses request sets, by their Responses names: an error about one names the
# field the client sent.
_RESPONSES_NAMES = {"max_completion_tokens": "max_output_tokens", "response_format": "text.format",
                    "response_format.json_schema.schema": "text.format.schema", "messages": "input",
                    "reasoning_effort": "reasoning.effort"}


def to_chat(request: ResponsesRequest, history: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
    """`history`: the stored conversation `previous_response_id` continues (None: no store to read it from)."""
    if request.background:
        raise bad_request("background mode is not served by this server: leave `background` false (stream the "
                          "response to follow it as it is made).", "background")
    if request.previous_response_id is not None and history is None:
        raise bad_request("previous_response_id needs the response store, and this server runs without one "
                          "(CHOIR_STORE=off): send the whole conversation in `input`.", "previous_response_id")
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    messages = [*system, *(history or []), *turn_messages(request)]
    if not messages:
        raise bad_request("input must not be empty.", "input")
    body: dict[str, Any] = {"messages": messages, "stream": request.stream, "model": request.model,
                            "max_completion_tokens": request.max_output_tokens, "temperature": request.temperature,
                            "top_p": request.top_p, "parallel_tool_calls": request.parallel_tool_calls,
                            "user": request.user, "include_reasoning": request.include_reasoning,
                            "reasoning_effort": request.reasoning.effort if request.reasoning else None,
                            "chat_template_kwargs": request.chat_template_kwargs}
    if LOGPROBS in (request.include or ()):
        body["logprobs"], body["top_logprobs"] = True, request.top_logprobs
    if request.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.parameters, "strict": t.strict}}
                         for t in request.tools]
    choice = request.tool_choice
    if choice == "auto" and not request.tools:
        choice = None  # OpenAI's default, whether or not there are tools
    body["tool_choice"] = {"type": "function", "function": {"name": choice.name}} \
        if isinstance(choice, msgspec.Struct) else choice
    chat = parse_strict({k: v for k, v in body.items() if v is not None}, ChatCompletionRequest)
    text_format = request.text.format if request.text else None
    if isinstance(text_format, JsonSchemaTextFormat):
        chat.response_format = JsonSchemaFormat(json_schema=text_format.as_chat())
    elif text_format is not None:
        chat.response_format = text_format
    return chat


def turn_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """This request's input as chat messages (reasoning items go to the assistant turn they belong to)."""
    if isinstance(request.input, str):
        return [{"role": "user", "content": request.input}]
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # reasoning waiting for the assistant turn that follows it
    for index, item in enumerate(request.input):
        message = _message(index, item)
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


def _message(index: int, item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind not in _ITEM_TYPES:
        raise bad_request(f"input item type `{kind}` is not supported: use {', '.join(_ITEM_TYPES)}.",
                          f"input[{index}].type")
    try:
        parsed = msgspec.convert({**item, "type": kind}, _ITEM_TYPES[kind], strict=True)
    except msgspec.ValidationError as exc:
        raise bad_request(f"Invalid input item {index}: {exc}", f"input[{index}]") from None
    if isinstance(parsed, ReasoningInput):
        if parsed.encrypted_content is not None:
            raise bad_request("Encrypted reasoning is not supported: send its text in `content`.",
                              f"input[{index}].encrypted_content")
        parts = parsed.content or parsed.summary
        return {"role": "assistant", "reasoning": "".join(part.text for part in parts)}
    if isinstance(parsed, FunctionCallInput):
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": parsed.call_id, "type": "function",
             "function": {"name": parsed.name, "arguments": parsed.arguments}}]}
    if isinstance(parsed, FunctionCallOutputInput):
        return {"role": "tool", "tool_call_id": parsed.call_id, "content": parsed.output}
    content = parsed.content if isinstance(parsed.content, str) else "".join(part.text for part in parsed.content)
    return {"role": parsed.role, "content": content}


async def plan_response(pipeline: Pipeline, request: ResponsesRequest, response_id: str, created: int,
                        history: list[dict[str, Any]] | None = None,
                        store: bool = False) -> tuple[ChatJob, ResponseBuilder]:
    try:
        job = await plan_chat(pipeline, to_chat(request, history), response_id, created)
    except APIError as exc:
        if history and exc.param == "messages" and "context length" in exc.message:
            raise bad_request(f"{exc.message} The conversation previous_response_id continues is too long for "
                              "the model: start a new one, or send a shorter input.", "previous_response_id") \
                from None
        raise _in_responses_terms(exc) from None
    return job, ResponseBuilder(job, request, store)


def _in_responses_terms(error: APIError) -> APIError:
    """An error about a chat field the request set, told with the Responses field's name."""
    param = error.param or ""
    name = _RESPONSES_NAMES.get(param) or _RESPONSES_NAMES.get(param.split("[")[0].split(".")[0])
    if name is None:
        return error
    message = error.message
    for chat_name in ("max_completion_tokens", "response_format", "messages", "reasoning_effort"):
        message = message.replace(chat_name, _RESPONSES_NAMES[chat_name])
    renamed = APIError(error.status, message, name)
    renamed.headers = error.headers
    return renamed


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


async def stream_response(aggregator: Aggregator, job: ChatJob, builder: ResponseBuilder, counts: TokenCounts,
                          on_close: Callable[[Response], Awaitable[None]] | None = None
                          ) -> AsyncGenerator[bytes, None]:
    """The lifecycle events as SSE frames, those of one engine output together; the closing ones end the stream.
    `on_close` gets the response as it ended before its closing events go out (a client that reads them may
    continue it at once)."""
    reader, outbox = job.output(), Outbox(len(job.choices))
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
            if item := outbox.send([named_frame(*event) for event in events], finished):
                yield item
    yield outbox.close()
