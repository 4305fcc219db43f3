"""The Responses API's answer: the final `response` object, or the lifecycle events that stream it.

Events, each with the next `sequence_number`: response.created, response.in_progress; per output
item: response.output_item.added, then for reasoning response.content_part.added (a reasoning_text
part), response.reasoning_text.delta (many), response.reasoning_text.done,
response.content_part.done; for a message response.content_part.added, response.output_text.delta
(many), response.output_text.done, response.content_part.done; for a function call
response.function_call_arguments.delta (many) and .done; then response.output_item.done. Last
response.completed, or response.incomplete (max_output_tokens), or response.failed.
"""

import uuid
from typing import Any, cast

import msgspec

from choir.app.errors import error_for
from choir.app.serving import reasoning_blob
from choir.app.serving.chat import ChatJob
from choir.app.serving.chat_output import MessageParts
from choir.app.serving.response_tools import call_item, callables, custom_input
from choir.core.protocol.chat import TokenLogprob
from choir.core.protocol.responses import (
    ConversationRef,
    CustomToolCallOutput,
    DeltaLogprob,
    DeltaTopLogprob,
    FunctionCallOutput,
    IncompleteDetails,
    InputTokensDetails,
    ItemStatus,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    ReasoningOutput,
    ReasoningText,
    Response,
    ResponseError,
    ResponseEvent,
    ResponsesRequest,
    ResponseStatus,
    ResponseUsage,
)

_encode = msgspec.json.encode
Event = tuple[str, bytes]  # an SSE event's name (the event type) and its JSON data
ENCRYPTED_REASONING = "reasoning.encrypted_content"  # the `include` value that asks for it
CallItem = FunctionCallOutput | CustomToolCallOutput


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponseBuilder:
    def __init__(self, job: ChatJob, request: ResponsesRequest, store: bool = False) -> None:
        self.job, self.request, self.store = job, request, store  # store: the response will be stored
        self.sequence = 0
        self.closed: Response | None = None  # the response as it ended (completed or incomplete)
        self.output: list[OutputMessage | CallItem | ReasoningOutput] = []
        self.reasoning: ReasoningOutput | None = None  # the reasoning item being streamed, if any
        self.text: OutputMessage | None = None  # the message item being streamed, if any
        self.calls: dict[int, CallItem] = {}  # streamed tool calls by their delta index
        self.tools = callables(request.tools)  # what a call's name means: a function, namespaced, or custom
        self.encrypt_reasoning = ENCRYPTED_REASONING in (request.include or ())
        self.pending: dict[int, Any] = {}  # a call's header, until its arguments begin (then it is an item)
        self.custom_arguments: dict[int, str] = {}  # a custom tool call's arguments, until it is done

    def response(self, status: ResponseStatus, **fields: Any) -> Response:
        request = self.request
        return Response(id=self.job.response_id, created_at=self.job.created, status=status, model=self.job.model,
                        output=list(self.output), instructions=request.instructions,
                        max_output_tokens=request.max_output_tokens, temperature=request.temperature,
                        top_p=request.top_p, parallel_tool_calls=request.parallel_tool_calls is not False,
                        tool_choice=msgspec.to_builtins(request.tool_choice) if request.tool_choice else "auto",
                        tools=request.tools or [], reasoning=request.reasoning or msgspec.UNSET,
                        metadata=request.metadata or msgspec.UNSET, top_logprobs=self._top_logprobs,
                        store=self.store, previous_response_id=request.previous_response_id,
                        background=request.background, truncation=request.truncation,
                        conversation=ConversationRef(request.conversation_id) if request.conversation_id else None,
                        **fields)

    @property
    def _top_logprobs(self) -> int | None:
        return (self.job.request.top_logprobs or 0) if self.job.request.logprobs else None

    def final(self, parts: MessageParts, finish_reason: str | None, output_tokens: int,
              reasoning_tokens: int | None, cached: int | None = None,
              logprobs: list[TokenLogprob] | None = None) -> Response:
        """Items for what was said, as vLLM's server makes them: no message without text, no call without
        arguments (a forced call that never began). `logprobs`: every output token's."""
        status: ItemStatus = "incomplete" if finish_reason == "length" else "completed"
        if parts.reasoning:
            reasoning = ReasoningOutput(id=_item_id("rs"), status=status, content=[ReasoningText(text=parts.reasoning)])
            if self.encrypt_reasoning:
                reasoning.encrypted_content = reasoning_blob.encode(parts.reasoning)
            self.output.append(reasoning)
        if parts.content:
            self.output.append(OutputMessage(id=_item_id("msg"), status=status,
                                             content=[OutputText(text=parts.content, logprobs=logprobs or [])]))
        for call in parts.tool_calls:
            if call.function.arguments:
                self.output.append(call_item(_item_id("fc"), call.id, call.function.name, call.function.arguments,
                                             status, self.tools))
        return self._closing_response(status, output_tokens, reasoning_tokens, cached)

    def _closing_response(self, status: ItemStatus, output_tokens: int, reasoning_tokens: int | None,
                          cached: int | None) -> Response:
        input_tokens = self.job.prompt_tokens
        usage = ResponseUsage(input_tokens=input_tokens, output_tokens=output_tokens,
                              input_tokens_details=InputTokensDetails(cached_tokens=cached or 0),
                              output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens or 0),
                              total_tokens=input_tokens + output_tokens)
        incomplete = IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
        self.closed = self.response(status, usage=usage, incomplete_details=incomplete)
        return self.closed

    # Streaming

    def _event(self, type: str, **fields: Any) -> Event:
        """An SSE event: its name (the event's type) and its JSON data."""
        event = ResponseEvent(type=type, sequence_number=self.sequence, **fields)
        self.sequence += 1
        return type, _encode(event)

    def start(self) -> list[Event]:
        created = self.response("queued" if self.request.background else "in_progress")
        return [self._event("response.created", response=created),
                self._event("response.in_progress", response=self.response("in_progress"))]

    def add(self, parts: MessageParts, logprobs: list[TokenLogprob] | None = None) -> list[Event]:
        """Events for what one engine output said; `logprobs`: its tokens', sent with its text."""
        events: list[Event] = []
        if parts.reasoning:
            if self.reasoning is None:
                events += self._open_reasoning()
            reasoning = self.reasoning
            assert reasoning is not None
            reasoning.content[0].text += parts.reasoning
            events.append(self._event("response.reasoning_text.delta", item_id=reasoning.id,
                                      output_index=self._index(reasoning), content_index=0, delta=parts.reasoning))
        if parts.content or parts.tool_calls:
            events += self._close_reasoning("completed")  # what follows the reasoning ends it
        if parts.content:
            if self.text is None:
                events += self._open_text()
            text = self.text
            assert text is not None
            part = text.content[0]
            part.text += parts.content
            part.logprobs += logprobs or []
            events.append(self._event("response.output_text.delta", item_id=text.id, output_index=self._index(text),
                                      content_index=0, delta=parts.content, logprobs=_delta_logprobs(logprobs)))
        for call in parts.tool_calls:
            events += self._add_call(call)
        return events

    def finish(self, finish_reason: str | None, output_tokens: int, reasoning_tokens: int | None,
               cached: int | None = None) -> list[Event]:
        status: ItemStatus = "incomplete" if finish_reason == "length" else "completed"
        events = self._close_reasoning(status) + self._close_text(status)
        for index, call in self.calls.items():
            events += self._close_call(index, call, status)
        # OpenAI ends an incomplete response with its own event; vLLM with response.completed (the profile's say)
        kind = "response.completed" if status == "completed" else self.incomplete_event
        return [*events, self._event(kind, response=self._closing_response(status, output_tokens,
                                                                            reasoning_tokens, cached))]

    @property
    def incomplete_event(self) -> str:
        return self.job.compat.rules.incomplete_response_event or "response.incomplete"

    def failed(self, error: Exception) -> Event:
        return self._event("response.failed", response=self.failed_response(error))

    def failed_response(self, error: Exception) -> Response:
        """The error as the client may see it: the message Choir's error mapping gives (a generic one,
        with no internals, for anything unexpected), never the exception's own text."""
        answer = error_for(error, self.job.response_id)
        code = "server_error" if answer.status >= 500 else "invalid_prompt"
        return self.response("failed", error=ResponseError(code=code, message=answer.message))

    def _index(self, item: Any) -> int:
        return self.output.index(item)

    def _open_text(self) -> list[Event]:
        self.text = OutputMessage(id=_item_id("msg"), status="in_progress", content=[])
        return self._open(self.text, OutputText(text=""))

    def _close_text(self, status: ItemStatus) -> list[Event]:
        item, self.text = self.text, None
        return self._close(item, status, "response.output_text.done", logprobs=[]) if item else []

    def _open_reasoning(self) -> list[Event]:
        self.reasoning = ReasoningOutput(id=_item_id("rs"), status="in_progress", content=[])
        return self._open(self.reasoning, ReasoningText(text=""))

    def _close_reasoning(self, status: ItemStatus) -> list[Event]:
        item, self.reasoning = self.reasoning, None
        if item is not None and self.encrypt_reasoning:
            item.encrypted_content = reasoning_blob.encode(item.content[0].text)
        return self._close(item, status, "response.reasoning_text.done") if item else []

    def _open(self, item: OutputMessage | ReasoningOutput, part: OutputText | ReasoningText) -> list[Event]:
        """An item of one text part (a message, reasoning) opens: added, then its part added (empty)."""
        self.output.append(item)
        index = self._index(item)
        added = self._event("response.output_item.added", output_index=index, item=item)
        cast(list[Any], item.content).append(part)  # events are encoded at once: the part is still empty in this one
        return [added, self._event("response.content_part.added", item_id=item.id, output_index=index,
                                   content_index=0, part=part)]

    def _close(self, item: OutputMessage | ReasoningOutput, status: ItemStatus, done: str,
               **fields: Any) -> list[Event]:
        index, part = self._index(item), item.content[0]
        item.status = status
        return [self._event(done, item_id=item.id, output_index=index, content_index=0, text=part.text, **fields),
                self._event("response.content_part.done", item_id=item.id, output_index=index, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _add_call(self, call: Any) -> list[Event]:
        """A call becomes an item once its arguments begin: one that never does is not said (as whole)."""
        events: list[Event] = []
        item = self.calls.get(call.index)
        arguments = call.function.arguments if isinstance(call.function.arguments, str) else ""
        if item is None:
            header = self.pending.setdefault(call.index, call)
            if not arguments:
                return events
            events += self._close_text("completed")  # a call after text ends the text
            name = header.function.name if isinstance(header.function.name, str) else ""
            item = call_item(_item_id("fc"), header.id or _item_id("call"), name, "", "in_progress", self.tools)
            self.calls[call.index] = item
            self.output.append(item)
            events.append(self._event("response.output_item.added", output_index=self._index(item), item=item))
        if arguments:
            if isinstance(item, CustomToolCallOutput):
                # Its text is read from the whole arguments (a JSON object): said once they are complete
                self.custom_arguments[call.index] = self.custom_arguments.get(call.index, "") + arguments
                return events
            item.arguments += arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item.id,
                                      output_index=self._index(item), delta=arguments))
        return events

    def _close_call(self, index: int, item: CallItem, status: ItemStatus) -> list[Event]:
        item.status = status  # incomplete: its arguments were cut short
        position = self._index(item)
        if isinstance(item, CustomToolCallOutput):
            item.input = custom_input(self.custom_arguments.pop(index, ""))
            done = self._event("response.custom_tool_call_input.done", item_id=item.id, output_index=position,
                               input=item.input)
        else:
            done = self._event("response.function_call_arguments.done", item_id=item.id, output_index=position,
                               arguments=item.arguments)
        return [done, self._event("response.output_item.done", output_index=position, item=item)]


def _delta_logprobs(logprobs: list[TokenLogprob] | None) -> list[DeltaLogprob]:
    return [DeltaLogprob(token=lp.token, logprob=lp.logprob, top_logprobs=[
        DeltaTopLogprob(token=top.token, logprob=top.logprob) for top in lp.top_logprobs]) for lp in logprobs or ()]
