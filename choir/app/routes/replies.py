"""A job's result as a Litestar response: JSON, or an SSE stream of ready frames."""

from collections.abc import AsyncGenerator, Callable

from litestar import Response

from choir.app.errors import error_json
from choir.app.request_ids import HEADER
from choir.app.routes.event_stream import EventStream, Keepalive
from choir.app.serving.streaming import DONE_FRAME, data_frame, first_frame


def json_response(body: object, base_id: str, headers: dict[str, str] | None = None) -> Response:
    return Response(body, headers={HEADER: base_id, **(headers or {})})


async def sse_response(frames: AsyncGenerator[bytes, None], base_id: str, response_id: str) -> EventStream:
    """`data:` events, one error event if the stream fails after it started, then `data: [DONE]`."""
    return await event_stream_response(frames, base_id, lambda exc: data_frame(error_json(exc, response_id)),
                                       last=DONE_FRAME)


async def event_stream_response(frames: AsyncGenerator[bytes, None], base_id: str,
                                error_frame: Callable[[Exception], bytes], last: bytes = b"",
                                headers: dict[str, str] | None = None,
                                keepalive: Keepalive | None = None) -> EventStream:
    """Named events, as the Responses API streams them (no [DONE] unless `last` says so); a failure
    after the stream started becomes its last event, `error_frame(exc)`."""
    first = await first_frame(frames)
    return EventStream(first, frames, last=last, error_frame=error_frame, headers={HEADER: base_id, **(headers or {})},
                       keepalive=keepalive)
