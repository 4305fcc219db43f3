"""A job's result as a Litestar response: JSON, or an SSE stream of pre-framed events."""

from collections.abc import AsyncIterator, Callable

from litestar import Response
from litestar.response import Stream

from app.routes.request_ids import HEADER
from app.serving.streaming import named_frames, sse_frames

# What Litestar's ServerSentEvent sends; Stream with frames built once per chunk avoids its
# per-event message object and text buffer (see benchmarks/README.md).
SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}


def json_response(body: object, base_id: str) -> Response:
    return Response(body, headers={HEADER: base_id})


def sse_response(chunks: AsyncIterator[bytes], base_id: str) -> Stream:
    return Stream(sse_frames(chunks), media_type="text/event-stream", headers={**SSE_HEADERS, HEADER: base_id})


def event_stream_response(events: AsyncIterator[tuple[str, bytes]], base_id: str,
                          on_error: Callable[[Exception], tuple[str, bytes]]) -> Stream:
    return Stream(named_frames(events, on_error), media_type="text/event-stream",
                  headers={**SSE_HEADERS, HEADER: base_id})
