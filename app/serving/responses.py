"""POST /v1/responses: the Responses API over the chat pipeline.

A Responses request is translated into a chat request (messages, tools, response format) and
planned and run as one; its single choice is then told as a `response` object with output items,
or streamed as the Responses lifecycle events.
"""

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import msgspec

from app.compat import OperationCompat
from app.errors import bad_request
from app.protocol import parse_strict
from app.protocol.chat import ChatCompletionRequest, JsonSchemaFormat
from app.protocol.responses import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputMessage,
    JsonSchemaTextFormat,
    ResponsesRequest,
)
from app.serving.chat import ChatJob, plan_chat
from app.serving.response_events import ResponseBuilder
from app.serving.streaming import Outbox, named_frame
from plugins.aggregation import Aggregator
from plugins.engine.protocol import Engine
from plugins.fanout import FanOut

_ITEM_TYPES = {"message": InputMessage, "function_call": FunctionCallInput,
               "function_call_output": FunctionCallOutputInput}


def to_chat(request: ResponsesRequest) -> ChatCompletionRequest:
    if request.store:
        raise bad_request("store is not supported: Choir keeps no responses. Send store false, or leave it out.",
                          "store")
    if request.previous_response_id is not None:
        raise bad_request("previous_response_id is not supported: Choir keeps no responses. Send the whole "
                          "conversation in `input`.", "previous_response_id")
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
    else:
        for index, item in enumerate(request.input):
            messages.append(_message(index, item))
    if not messages:
        raise bad_request("input must not be empty.", "input")
    body: dict[str, Any] = {"messages": messages, "stream": request.stream, "model": request.model,
                            "max_completion_tokens": request.max_output_tokens, "temperature": request.temperature,
                            "top_p": request.top_p, "parallel_tool_calls": request.parallel_tool_calls,
                            "user": request.user}
    if request.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.parameters, "strict": t.strict}}
                         for t in request.tools]
    choice = request.tool_choice
    body["tool_choice"] = {"type": "function", "function": {"name": choice.name}} \
        if isinstance(choice, msgspec.Struct) else choice
    chat = parse_strict({k: v for k, v in body.items() if v is not None}, ChatCompletionRequest)
    text_format = request.text.format if request.text else None
    if isinstance(text_format, JsonSchemaTextFormat):
        chat.response_format = JsonSchemaFormat(json_schema=text_format.as_chat())
    elif text_format is not None:
        chat.response_format = text_format
    return chat


def _message(index: int, item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind not in _ITEM_TYPES:
        raise bad_request(f"input item type `{kind}` is not supported: use {', '.join(_ITEM_TYPES)}.",
                          f"input[{index}].type")
    try:
        parsed = msgspec.convert({**item, "type": kind}, _ITEM_TYPES[kind], strict=True)
    except msgspec.ValidationError as exc:
        raise bad_request(f"Invalid input item {index}: {exc}", f"input[{index}]") from None
    if isinstance(parsed, FunctionCallInput):
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": parsed.call_id, "type": "function",
             "function": {"name": parsed.name, "arguments": parsed.arguments}}]}
    if isinstance(parsed, FunctionCallOutputInput):
        return {"role": "tool", "tool_call_id": parsed.call_id, "content": parsed.output}
    content = parsed.content if isinstance(parsed.content, str) else "".join(part.text for part in parsed.content)
    return {"role": parsed.role, "content": content}


async def plan_response(engine: Engine, fan_out: FanOut, compat: OperationCompat, request: ResponsesRequest,
                        response_id: str, created: int) -> tuple[ChatJob, ResponseBuilder]:
    job = await plan_chat(engine, fan_out, compat, to_chat(request), response_id, created)
    return job, ResponseBuilder(job, request)


async def respond(aggregator: Aggregator, job: ChatJob, builder: ResponseBuilder):
    [output] = await aggregator.collect(job.choices)
    completion = output.outputs[0]
    reader = job.output()
    parts = reader.whole(completion.text)
    job.counts.completion_tokens = len(completion.token_ids)
    return builder.final(parts, completion.finish_reason, len(completion.token_ids),
                         reader.reasoning_tokens(list(completion.token_ids), parts.reasoning))


async def stream_response(aggregator: Aggregator, job: ChatJob, builder: ResponseBuilder) -> AsyncIterator[bytes]:
    """The lifecycle events as SSE frames, those of one engine output together; the closing ones end the stream."""
    reader, outbox = job.output(), Outbox(len(job.choices))
    tokens: list[int] = []
    started = False
    async with aclosing(aggregator.merge(job.choices)) as batches:
        async for batch in batches:
            events = [] if started else builder.start()  # created and in_progress wait for the first output
            started, finished = True, 0
            for _, output in batch:
                completion = output.outputs[0]
                tokens += completion.token_ids
                finished += output.finished
                parts = reader.delta(completion.text, list(completion.token_ids), completion.finish_reason is not None)
                events += builder.add(parts)
                if completion.finish_reason is not None:
                    job.counts.completion_tokens = len(tokens)
                    events += builder.finish(completion.finish_reason, len(tokens), reader.streamed_reasoning_tokens())
            if item := outbox.send([named_frame(*event) for event in events], finished):
                yield item
    yield outbox.close()
