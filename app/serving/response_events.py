"""The Responses API's answer: the final `response` object, or the lifecycle events that stream it.

Events, each with the next `sequence_number`: response.created, response.in_progress; per output
item: response.output_item.added, then for a message response.content_part.added,
response.output_text.delta (many), response.output_text.done, response.content_part.done, and for
a function call response.function_call_arguments.delta (many) and .done; response.output_item.done;
last response.completed, or response.incomplete (max_output_tokens), or response.failed.
"""

import uuid
from typing import Any

import msgspec

from app.protocol.responses import (
    FunctionCallOutput,
    IncompleteDetails,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    Response,
    ResponseError,
    ResponseEvent,
    ResponsesRequest,
    ResponseUsage,
)
from app.serving.chat_output import MessageParts

_encode = msgspec.json.encode
Event = tuple[str, bytes]  # an SSE event's name (the event type) and its JSON data


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponseBuilder:
    def __init__(self, job: Any, request: ResponsesRequest) -> None:
        self.job, self.request = job, request
        self.sequence = 0
        self.output: list[OutputMessage | FunctionCallOutput] = []
        self.text: OutputMessage | None = None  # the message item being streamed, if any
        self.calls: dict[int, FunctionCallOutput] = {}  # streamed tool calls by their delta index

    def response(self, status: str, **fields: Any) -> Response:
        request = self.request
        return Response(id=self.job.response_id, created_at=self.job.created, status=status, model=self.job.model,
                        output=list(self.output), instructions=request.instructions,
                        max_output_tokens=request.max_output_tokens, temperature=request.temperature,
                        top_p=request.top_p, parallel_tool_calls=request.parallel_tool_calls is not False,
                        tool_choice=msgspec.to_builtins(request.tool_choice) if request.tool_choice else "auto",
                        tools=request.tools or [], **fields)

    def final(self, parts: MessageParts, finish_reason: str | None, output_tokens: int,
              reasoning_tokens: int | None) -> Response:
        status = "incomplete" if finish_reason == "length" else "completed"
        if parts.content or not parts.tool_calls:
            self.output.append(OutputMessage(id=_item_id("msg"), status=status,
                                             content=[OutputText(text=parts.content or "")]))
        for call in parts.tool_calls:
            self.output.append(FunctionCallOutput(id=_item_id("fc"), call_id=call.id, name=call.function.name,
                                                  arguments=call.function.arguments, status="completed"))
        return self._closing_response(status, output_tokens, reasoning_tokens)

    def _closing_response(self, status: str, output_tokens: int, reasoning_tokens: int | None) -> Response:
        input_tokens = self.job.counts.prompt_tokens or 0
        usage = ResponseUsage(input_tokens=input_tokens, output_tokens=output_tokens,
                              output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens or 0),
                              total_tokens=input_tokens + output_tokens)
        incomplete = IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
        return self.response(status, usage=usage, incomplete_details=incomplete)

    # Streaming

    def _event(self, type: str, **fields: Any) -> Event:
        """An SSE event: its name (the event's type) and its JSON data."""
        event = ResponseEvent(type=type, sequence_number=self.sequence, **fields)
        self.sequence += 1
        return type, _encode(event)

    def start(self) -> list[Event]:
        return [self._event("response.created", response=self.response("in_progress")),
                self._event("response.in_progress", response=self.response("in_progress"))]

    def add(self, parts: MessageParts) -> list[Event]:
        events: list[Event] = []
        if parts.content:
            if self.text is None:
                events += self._open_text()
            self.text.content[0].text += parts.content
            events.append(self._event("response.output_text.delta", item_id=self.text.id,
                                      output_index=self._index(self.text), content_index=0, delta=parts.content,
                                      logprobs=[]))
        for call in parts.tool_calls:
            events += self._add_call(call)
        return events

    def finish(self, finish_reason: str | None, output_tokens: int, reasoning_tokens: int | None) -> list[Event]:
        status = "incomplete" if finish_reason == "length" else "completed"
        events = self._close_text(status)
        for call in self.calls.values():
            events += self._close_call(call)
        if not self.output:  # nothing was said: still one (empty) message, as the whole response has
            events += self._open_text() + self._close_text(status)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=self._closing_response(status, output_tokens,
                                                                            reasoning_tokens))]

    def failed(self, error: Exception) -> Event:
        return self._event("response.failed", response=self.response(
            "failed", error=ResponseError(code="server_error", message=str(error))))

    def _index(self, item: Any) -> int:
        return self.output.index(item)

    def _open_text(self) -> list[Event]:
        self.text = OutputMessage(id=_item_id("msg"), status="in_progress", content=[])
        self.output.append(self.text)
        added = self._event("response.output_item.added", output_index=self._index(self.text), item=self.text)
        self.text.content.append(OutputText(text=""))
        part = self._event("response.content_part.added", item_id=self.text.id, output_index=self._index(self.text),
                           content_index=0, part=OutputText(text=""))
        return [added, part]

    def _close_text(self, status: str) -> list[Event]:
        item, self.text = self.text, None
        if item is None:
            return []
        index, part = self._index(item), item.content[0]
        item.status = status
        return [self._event("response.output_text.done", item_id=item.id, output_index=index, content_index=0,
                            text=part.text, logprobs=[]),
                self._event("response.content_part.done", item_id=item.id, output_index=index, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _add_call(self, call: Any) -> list[Event]:
        events: list[Event] = []
        item = self.calls.get(call.index)
        if item is None:
            events += self._close_text("completed")  # a call after text ends the text
            name = call.function.name if isinstance(call.function.name, str) else ""
            item = FunctionCallOutput(id=_item_id("fc"), call_id=call.id or _item_id("call"), name=name,
                                      arguments="", status="in_progress")
            self.calls[call.index] = item
            self.output.append(item)
            events.append(self._event("response.output_item.added", output_index=self._index(item), item=item))
        arguments = call.function.arguments if isinstance(call.function.arguments, str) else ""
        if arguments:
            item.arguments += arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item.id,
                                      output_index=self._index(item), delta=arguments))
        return events

    def _close_call(self, item: FunctionCallOutput) -> list[Event]:
        item.status = "completed"
        index = self._index(item)
        return [self._event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                            arguments=item.arguments),
                self._event("response.output_item.done", output_index=index, item=item)]
