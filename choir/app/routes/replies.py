"""A job's result as a Litestar response: JSON, or an SSE stream of ready frames."""

from collections.abc import AsyncGenerator, Callable
from typing import Any

from litestar import Response
from litestar.response.base import ASGIResponse
from litestar.serialization import encode_json, get_serializer
from litestar.types import Receive, Scope, Send

from choir.app.errors import error_json
from choir.app.request_ids import HEADER
from choir.app.routes.event_stream import EventStream, Keepalive
from choir.app.serving.streaming import DONE_FRAME, data_frame, first_frame


def json_response(body: object, base_id: str, headers: dict[str, str] | None = None) -> Response:
    return JSONReply(body, headers={HEADER: base_id, **(headers or {})})


class JSONReply(Response):
    """A JSON answer sent as Litestar's Response sends it (its serializer, the same headers), without its
    general-purpose ASGIResponse (a MutableScopeHeaders filled header by header, cookies encoded, a body check):
    13 µs of a whole response's 15 µs there. Cookies and background tasks, which no JSON answer here has, still take
    Litestar's own path; a HEAD request never reaches the POST operations that answer so."""

    def to_asgi_response(self, app: Any, request: Any, *, background: Any = None, cookies: Any = None,
                         headers: dict[str, str] | None = None, status_code: int | None = None,
                         type_encoders: Any = None, **kwargs: Any) -> ASGIResponse:
        if background or cookies or self.background or self.cookies:
            return super().to_asgi_response(app, request, background=background, cookies=cookies, headers=headers,
                                            status_code=status_code, type_encoders=type_encoders, **kwargs)
        if self.response_type_encoders:
            type_encoders = {**(type_encoders or {}), **self.response_type_encoders}
        body = encode_json(self.content, get_serializer(type_encoders))
        raw = [(name.lower().encode("latin-1"), value.encode("latin-1"))
               for name, value in ({**headers, **self.headers} if headers else self.headers).items()]
        raw += ((b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)))
        return _JSONBody(self.status_code or status_code or 200, raw, body)


class _JSONBody(ASGIResponse):
    """Its two messages, ready: none of ASGIResponse's own set-up (hence no call to its __init__)."""

    __slots__ = ("raw_headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status, self.raw_headers, self.body = status, headers, body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


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
