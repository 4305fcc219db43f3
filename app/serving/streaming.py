"""What streaming responses share: usage options, priming, and SSE framing with in-stream errors."""

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from app.errors import error_json
from app.protocol.common import StreamOptions
from plugins.metrics import STREAM_DISCONNECTS

log = structlog.get_logger("choir.stream")
DONE_FRAME = b"data: [DONE]\n\n"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StreamPlan:
    include_usage: bool
    continuous_usage: bool

    @classmethod
    def of(cls, options: StreamOptions | None) -> "StreamPlan":
        include = bool(options and options.include_usage)
        return cls(include_usage=include, continuous_usage=include and bool(options and options.continuous_usage_stats))


async def primed(chunks: AsyncIterator[T]) -> AsyncIterator[T]:
    """Wait for the first chunk, so that an invalid request fails with a real HTTP status
    instead of a 200 stream that carries the error."""
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await chunks.aclose()
        raise

    async def rest() -> AsyncIterator[T]:
        try:
            if first is not None:
                yield first
                async for chunk in chunks:
                    yield chunk
        finally:
            await chunks.aclose()

    return rest()


async def _framed(items: AsyncIterator[Any], frame: Callable[[Any], bytes], error_frame: Callable[[Exception], bytes],
                  last: bytes = b"") -> AsyncIterator[bytes]:
    """`frame(item)` for each item, `error_frame(exc)` if the stream fails after it started, then `last`.
    Leaving early (the client went away) closes `items`, which aborts what they read from."""
    try:
        async for item in items:
            yield frame(item)
    except (asyncio.CancelledError, GeneratorExit):
        STREAM_DISCONNECTS.inc()  # closed or cancelled mid-stream: the client went away
        raise
    except Exception as exc:
        log.warning("stream failed", error=str(exc))
        yield error_frame(exc)
    finally:
        await items.aclose()
    if last:
        yield last


def _data_frame(data: bytes) -> bytes:
    # One concatenation per event: JSON has no raw newline, so no event needs splitting into lines.
    return b"data: " + data + b"\n\n"


def _named_frame(event: tuple[str, bytes]) -> bytes:
    return b"event: " + event[0].encode() + b"\ndata: " + event[1] + b"\n\n"


def sse_frames(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Each chunk as an SSE event (`data: <json>`), one error event if the stream fails, then `data: [DONE]`."""
    return _framed(chunks, _data_frame, lambda exc: _data_frame(error_json(exc)), DONE_FRAME)


def named_frames(events: AsyncIterator[tuple[str, bytes]],
                 on_error: Callable[[Exception], tuple[str, bytes]]) -> AsyncIterator[bytes]:
    """Named SSE events (`event: <type>` then `data: <json>`), as the Responses API streams them;
    no [DONE]. A failure after the stream started becomes its last event, from `on_error`."""
    return _framed(events, _named_frame, lambda exc: _named_frame(on_error(exc)))
