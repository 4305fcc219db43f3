"""What streaming responses share: usage options, priming, and SSE framing with in-stream errors."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

import structlog

from app.errors import error_json
from app.protocol.common import StreamOptions

log = structlog.get_logger("choir.stream")
DONE = b"[DONE]"
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


async def sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The data of each SSE event: the chunks, one error event if the stream fails, then [DONE]."""
    try:
        async for chunk in chunks:
            yield chunk
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except Exception as exc:
        log.warning("stream failed", error=str(exc))
        yield error_json(exc)
    finally:
        await chunks.aclose()
    yield DONE
