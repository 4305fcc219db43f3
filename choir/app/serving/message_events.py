"""The Messages API's answer: a Message, or the stream events that tell it.

Events: message_start; per content block (thinking, text, tool_use, in the order said, indices 0, 1, ...)
content_block_start, content_block_delta (thinking_delta, then a signature_delta; text_delta; input_json_delta),
content_block_stop; then message_delta (stop_reason, stop_sequence, the usage so far) and message_stop. A ping
follows the first block's start, and choir/app/routes/messages.py adds one whenever the stream is quiet.

A tool call becomes a block once its arguments begin, as the Responses API makes its items: a forced call cut
before its arguments is no call. A call cut by max_tokens keeps the partial input the SDKs read from its deltas
(jiter's partial mode: the complete values).
"""

import base64
import hashlib
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import jiter
import msgspec

from choir.app.serving.chat import ChatJob
from choir.app.serving.chat_output import MessageParts
from choir.app.serving.counts import TokenCounts
from choir.app.serving.streaming import Outbox, named_frame
from choir.core.protocol.messages import (
    ContentBlock,
    DeltaUsage,
    Message,
    MessageEvent,
    MessagesRequest,
    MessageUsage,
    StopReason,
    TextOutput,
    ThinkingOutput,
    ToolUseOutput,
)
from choir.engine.outputs import SampleOutput
from choir.plugins.aggregation import Aggregator, cached_tokens

_encode = msgspec.json.encode
Event = tuple[str, bytes]  # an SSE event's name (its type) and its JSON data


def signature(thinking: str) -> str:
    """A thinking block's signature: a digest of its text. Anthropic's encrypt the thinking for its own models;
    an open model's template reads the text, so the signature is never checked."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as its `input` object: whole, or as much as an output cut short holds."""
    try:
        value = jiter.from_json(arguments.encode(), partial_mode=True)  # as the SDKs read a streamed input
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessageBuilder:
    def __init__(self, job: ChatJob, request: MessagesRequest) -> None:
        self.job, self.request = job, request
        self.blocks: list[ContentBlock] = []
        self.open: ContentBlock | None = None  # the block being streamed, at index len(blocks) - 1
        self.calls: dict[int, ToolUseOutput] = {}  # streamed tool calls by their delta index
        self.arguments: dict[str, str] = {}  # their arguments so far, by block id
        self.pending: dict[int, Any] = {}  # a call's header, until its arguments begin
        self.pinged = False

    # What both answers share

    def stop(self, completion: SampleOutput, output_tokens: int, called: bool) -> tuple[StopReason, str | None]:
        if completion.finish_reason == "length":
            # The budget was the room the context left when that was less than max_tokens.
            return ("max_tokens" if output_tokens >= self.request.max_tokens
                    else "model_context_window_exceeded"), None
        if called:
            return "tool_use", None
        if isinstance(completion.stop_reason, str):  # the stop sequence that matched (a token id is no sequence)
            return "stop_sequence", completion.stop_reason
        return "end_turn", None

    def usage(self, output_tokens: int, cached: int | None) -> MessageUsage:
        return MessageUsage(input_tokens=self.job.prompt_tokens - (cached or 0), output_tokens=output_tokens,
                            cache_read_input_tokens=cached or 0)

    def message(self, content: list[ContentBlock], stop: tuple[StopReason | None, str | None],
                usage: MessageUsage) -> Message:
        return Message(id=self.job.response_id, model=self.job.model, content=content, stop_reason=stop[0],
                       stop_sequence=stop[1], usage=usage)

    def whole(self, parts: MessageParts, completion: SampleOutput, cached: int | None) -> Message:
        content: list[ContentBlock] = []
        if parts.reasoning:
            content.append(ThinkingOutput(thinking=parts.reasoning, signature=signature(parts.reasoning)))
        if parts.content:
            content.append(TextOutput(text=parts.content))
        content += [ToolUseOutput(id=_tool_id(call.id), name=call.function.name,
                                  input=tool_input(call.function.arguments))
                    for call in parts.tool_calls if call.function.arguments]
        if not content:  # Anthropic's answer always has a block, if only an empty text
            content.append(TextOutput(text=""))
        tokens = len(completion.token_ids)
        called = any(isinstance(block, ToolUseOutput) for block in content)
        return self.message(content, self.stop(completion, tokens, called), self.usage(tokens, cached))

    # Streaming

    def start(self, cached: int | None) -> list[Event]:
        return [_event("message_start", message=self.message([], (None, None), self.usage(0, cached)))]

    def add(self, parts: MessageParts) -> list[Event]:
        events: list[Event] = []
        if parts.tool_calls and isinstance(self.open, ToolUseOutput):  # the open call's arguments first
            events += self._add_calls(parts.tool_calls)
            parts = MessageParts(parts.content, parts.reasoning)
        if parts.reasoning:
            events += self._write(ThinkingOutput, "thinking_delta", "thinking", parts.reasoning)
        if parts.content:
            events += self._write(TextOutput, "text_delta", "text", parts.content)
        return events + self._add_calls(parts.tool_calls) if parts.tool_calls else events

    def _add_calls(self, calls: list[Any]) -> list[Event]:
        return [event for call in calls for event in self._add_call(call)]

    def finish(self, completion: SampleOutput, output_tokens: int, cached: int | None) -> list[Event]:
        stop_reason, stop_sequence = self.stop(completion, output_tokens, bool(self.calls))
        events = self._close()
        if not self.blocks:  # as whole: at least an empty text block
            events += self._open(TextOutput(text="")) + self._close()
        usage = self.usage(output_tokens, cached)
        return [*events, _event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                usage=DeltaUsage(output_tokens=output_tokens, input_tokens=usage.input_tokens,
                                                 cache_creation_input_tokens=usage.cache_creation_input_tokens,
                                                 cache_read_input_tokens=usage.cache_read_input_tokens)),
                _event("message_stop")]

    def _write(self, kind: type, delta: str, field: str, text: str) -> list[Event]:
        """Text for a block of `kind`: into the open one, or a new one (what was open before it ends)."""
        events = [] if isinstance(self.open, kind) else self._close() + self._open(kind(**_empty(kind)))
        block = self.open
        setattr(block, field, getattr(block, field) + text)
        return [*events, _event("content_block_delta", index=len(self.blocks) - 1, delta={"type": delta, field: text})]

    def _open(self, block: ContentBlock) -> list[Event]:
        self.blocks.append(block)
        self.open = block
        events = [_event("content_block_start", index=len(self.blocks) - 1, content_block=block)]
        if not self.pinged:  # as Anthropic's streams: a ping after the first block's start
            self.pinged = True
            events.append(_event("ping"))
        return events

    def _close(self) -> list[Event]:
        block, self.open = self.open, None
        if block is None:
            return []
        index = len(self.blocks) - 1  # the open block is the last (blocks of equal text compare equal)
        events = []
        if isinstance(block, ThinkingOutput):
            block.signature = signature(block.thinking)
            events.append(_event("content_block_delta", index=index,
                                 delta={"type": "signature_delta", "signature": block.signature}))
        if isinstance(block, ToolUseOutput):
            block.input = tool_input(self.arguments[block.id])
        return [*events, _event("content_block_stop", index=index)]

    def _add_call(self, call: Any) -> list[Event]:
        events: list[Event] = []
        arguments = call.function.arguments if isinstance(call.function.arguments, str) else ""
        block = self.calls.get(call.index)
        if block is None:
            header = self.pending.setdefault(call.index, call)
            if not arguments:
                return events
            name = header.function.name if isinstance(header.function.name, str) else ""
            block = ToolUseOutput(id=_tool_id(header.id), name=name, input={})
            self.calls[call.index], self.arguments[block.id] = block, ""
            events += self._close() + self._open(block)
        elif block is not self.open:  # an earlier call's arguments, after another block: not in Anthropic's order
            return events
        self.arguments[block.id] += arguments
        return [*events, _event("content_block_delta", index=len(self.blocks) - 1,
                                delta={"type": "input_json_delta", "partial_json": arguments})]


def _empty(kind: type) -> dict[str, str]:
    return {"thinking": "", "signature": ""} if kind is ThinkingOutput else {"text": ""}


def _tool_id(chat_id: str | None) -> str:
    """Anthropic's `toolu_` ids, from the chat call's (`call_...`, or a parser's own)."""
    suffix = (chat_id or "").removeprefix("call_").removeprefix("chatcmpl-tool-")
    return f"toolu_{suffix or uuid.uuid4().hex[:24]}"


def _event(type: str, **fields: Any) -> Event:
    return type, _encode(MessageEvent(type=type, **fields))


async def answer_message(aggregator: Aggregator, job: ChatJob, builder: MessageBuilder,
                         counts: TokenCounts) -> Message:
    [output] = await aggregator.collect(job.choices)
    completion = output.outputs[0]
    reader = job.output()
    parts = reader.whole(completion.text)
    counts.completion_tokens = len(completion.token_ids)
    return builder.whole(parts, completion, cached_tokens(job.choices, [output.num_cached_tokens]))


async def stream_message(aggregator: Aggregator, job: ChatJob, builder: MessageBuilder,
                         counts: TokenCounts) -> AsyncGenerator[bytes, None]:
    """The events as SSE frames, those of one engine output together; the closing ones end the stream."""
    reader = job.output()
    outbox = Outbox(1)
    generated, cached, started = 0, None, False
    async with aclosing(aggregator.merge(job.choices)) as batches:
        async for batch in batches:
            events: list[Event] = []
            for choice, output in batch:
                if not started:
                    started, cached = True, cached_tokens([choice], [output.num_cached_tokens])
                    events += builder.start(cached)
                completion = output.outputs[0]
                generated += len(completion.token_ids)
                finished = completion.finish_reason is not None
                events += builder.add(reader.delta(completion.text, list(completion.token_ids), finished))
                if finished:
                    counts.completion_tokens = generated
                    events += builder.finish(completion, generated, cached)
            if item := outbox.send([named_frame(*event) for event in events], sum(o.finished for _, o in batch)):
                yield item
    yield outbox.close()
