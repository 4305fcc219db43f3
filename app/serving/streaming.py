"""What streaming responses share: usage options, priming, and SSE framing with in-stream errors."""

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

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


async def sse_frames(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Each chunk framed as an SSE event (`data: <json>\\n\\n`), one error event if the stream fails,
    then `data: [DONE]`. Framed here in one concatenation per chunk: JSON has no raw newline, so no
    event needs splitting into lines."""
    try:
        async for chunk in chunks:
            yield b"data: " + chunk + b"\n\n"
    except (asyncio.CancelledError, GeneratorExit):
        STREAM_DISCONNECTS.inc()  # closed or cancelled mid-stream: the client went away
        raise
    except Exception as exc:
        log.warning("stream failed", error=str(exc))
        yield b"data: " + error_json(exc) + b"\n\n"
    finally:
        await chunks.aclose()
    yield DONE_FRAME


def named_frames(events: AsyncIterator[tuple[str, bytes]],
                 on_error: Callable[[Exception], tuple[str, bytes]]) -> AsyncIterator[bytes]:
    """Named SSE events (`event: <type>` then `data: <json>`), as the Responses API streams them;
    no [DONE]. A failure after the stream started becomes its last event, from `on_error`."""

    async def frames() -> AsyncIterator[bytes]:
        try:
            async for name, data in events:
                yield b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            STREAM_DISCONNECTS.inc()
            raise
        except Exception as exc:
            log.warning("stream failed", error=str(exc))
            name, data = on_error(exc)
            yield b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"
        finally:
            await events.aclose()

    return frames()
