"""What streams share: usage options, SSE frames built from a per-stream template, and the first
frame awaited before answering.

A stream is an async iterator of frames, bytes ready for the wire: one item may hold several SSE
events (the choices of one engine step), so that they go out in one write. The item that ends
the stream is a `Final`: choir/app/routes/event_stream.py sends it with the end of the response.
"""

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import msgspec

from choir.core.protocol.common import StreamOptions

DONE_FRAME = b"data: [DONE]\n\n"
_encode = msgspec.json.encode


class Final(bytes):
    """The stream's last frames: nothing follows them but the end of the response."""


@dataclass(frozen=True, slots=True)
class StreamPlan:
    include_usage: bool
    continuous_usage: bool

    @classmethod
    def of(cls, options: StreamOptions | None) -> "StreamPlan":
        include = bool(options and options.include_usage)
        return cls(include_usage=include, continuous_usage=include and bool(options and options.continuous_usage_stats))


def data_frame(data: bytes) -> bytes:
    # One concatenation per event: JSON has no raw newline, so no event needs splitting into lines.
    return b"data: " + data + b"\n\n"


def named_frame(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


class ChunkFrames:
    """The `data:` frames of one stream's chunks. Every chunk repeats the stream's envelope (id,
    object, created, model, ...), so that part is encoded once: a frame is the template's head, the
    choice's JSON and its tail."""

    __slots__ = ("chunk_type", "envelope", "head", "tail")

    def __init__(self, chunk_type: type[msgspec.Struct], envelope: dict[str, Any]) -> None:
        self.chunk_type, self.envelope = chunk_type, envelope
        # The choices list is the only place `"choices":[]` can appear unescaped: strings escape quotes.
        head, _, tail = _encode(chunk_type(**envelope, choices=[])).partition(b'"choices":[]')
        self.head, self.tail = b"data: " + head + b'"choices":[', b"]" + tail + b"\n\n"

    def frame(self, choice: msgspec.Struct, usage: Any = None) -> bytes:
        if usage is not None:
            return data_frame(_encode(self.chunk_type(**self.envelope, choices=[choice], usage=usage)))
        return self.head + _encode(choice) + self.tail

    def frame_with(self, choice: msgspec.Struct, **fields: Any) -> bytes:
        """A chunk whose envelope has more than the stream's (e.g. a first chunk's prompt_token_ids)."""
        return data_frame(_encode(self.chunk_type(**self.envelope, **fields, choices=[choice])))

    def usage_frame(self, usage: Any) -> bytes:
        return data_frame(_encode(self.chunk_type(**self.envelope, choices=[], usage=usage)))


class Outbox:
    """What a stream sends: one item per batch of engine outputs. The frames of the batch that
    finishes the last choice are held, to end the stream with its closing frames (`Final`)."""

    __slots__ = ("held", "unfinished")

    def __init__(self, choices: int) -> None:
        self.unfinished = choices
        self.held: list[bytes] = []

    def send(self, frames: list[bytes], finished: int) -> bytes:
        """The item to yield now for a batch's frames (empty: nothing yet)."""
        self.unfinished -= finished
        if not self.unfinished:
            self.held += frames
            return b""
        return b"".join(frames)

    def close(self, *closing: bytes) -> Final:
        return Final(b"".join([*self.held, *closing]))


async def first_frame(frames: AsyncGenerator[bytes, None]) -> bytes:
    """Wait for a stream's first frame, so that an invalid request fails with a real HTTP status
    instead of a 200 stream that carries the error."""
    try:
        return await anext(frames)
    except StopAsyncIteration:
        return Final()
    except BaseException:
        await frames.aclose()
        raise
