"""EventStream: a Litestar response that sends a stream of ready SSE frames (choir/app/serving/streaming.py).

Litestar's `Stream` watches for a disconnect with an anyio task group, whose set-up and cancel
(it formats the task's repr) were ~15 % of the front end's CPU per streamed request; and it ends
every stream with a write of its own. Here the watcher is one asyncio task that cancels the
sending task when the client leaves (cancelling the engine's generator aborts the request), and
the last frames go out with the end of the response in one write.

A stream may have a keepalive (Anthropic's `ping`): sent whenever nothing went out for a while, by a timer
that looks once per period, so a frame costs one clock read rather than a timer of its own.
"""

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from litestar import Response
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Send

from choir.app.routes.disconnect import DisconnectWatch
from choir.app.serving.streaming import Final
from choir.plugins.metrics import STREAM_DISCONNECTS

log = structlog.get_logger("choir.stream")

# What Litestar's ServerSentEvent sends.
SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}


class EventStream(Response):
    """`first` (already awaited), then `frames`, then `last`; a failure after the stream started
    becomes `error_frame(exc)` + `last`, the stream's end."""

    __slots__ = ("error_frame", "first", "frames", "keepalive", "last")

    def __init__(self, first: bytes, frames: AsyncGenerator[bytes, None], *, last: bytes,
                 error_frame: Callable[[Exception], bytes], headers: dict[str, str],
                 keepalive: "Keepalive | None" = None) -> None:
        super().__init__(content=b"", media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
        self.first, self.frames, self.last, self.error_frame = first, frames, last, error_frame
        self.keepalive = keepalive

    def to_asgi_response(self, app: Any, request: Any, *, headers: dict[str, str] | None = None,
                         status_code: int | None = None, **_: Any) -> ASGIResponse:
        return _ASGIEventStream(self, headers={**(headers or {}), **self.headers},
                                status_code=self.status_code or status_code, media_type=self.media_type)


class _ASGIEventStream(ASGIResponse):
    _should_set_content_length = False

    def __init__(self, stream: EventStream, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream

    async def send_body(self, send: Send, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        watch = DisconnectWatch(receive, task)
        try:
            await self._send_frames(send)
        except asyncio.CancelledError:
            if not watch.left or task.uncancel() > 0:  # not (only) our own cancel: pass it on
                raise
            STREAM_DISCONNECTS.inc()
        finally:
            watch.stop()
            await self.stream.frames.aclose()  # a no-op unless we left early: then it aborts the engine requests

    async def _send_frames(self, send: Send) -> None:
        stream, frame = self.stream, self.stream.first
        pinger = _Pinger(send, stream.keepalive) if stream.keepalive is not None else None
        try:
            while not isinstance(frame, Final):
                if pinger is not None:
                    await pinger.send_frame(frame)
                else:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                try:
                    frame = await anext(stream.frames)
                except StopAsyncIteration:
                    frame = Final()
                except Exception as exc:
                    log.warning("stream failed", error=str(exc))
                    frame = Final(stream.error_frame(exc))
            if pinger is not None:
                await pinger.idle()
        finally:
            if pinger is not None:
                pinger.stop()
        await send({"type": "http.response.body", "body": frame + stream.last, "more_body": False})


@dataclass(frozen=True, slots=True)
class Keepalive:
    frame: bytes  # what to send
    every: float  # seconds of silence before it is sent


class _Pinger:
    """Sends the keepalive frame when nothing went out for `every` seconds: a timer looks once each `every`
    seconds; the stream's own frames go through `send_frame`, never at the same time as a keepalive."""

    __slots__ = ("busy", "keepalive", "last", "loop", "send", "sending", "timer")

    def __init__(self, send: Send, keepalive: Keepalive) -> None:
        self.send, self.keepalive = send, keepalive
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self.busy = False  # the stream's own frame is being sent
        self.sending: asyncio.Task | None = None  # a keepalive being sent
        self.timer = self.loop.call_later(keepalive.every, self._look)

    async def idle(self) -> None:
        """Once no keepalive is half-written."""
        if self.sending is not None:
            await self.sending

    async def send_frame(self, frame: bytes) -> None:
        if self.sending is not None:  # as idle(), without a coroutine per frame
            await self.sending
        self.busy = True
        try:
            await self.send({"type": "http.response.body", "body": frame, "more_body": True})
        finally:
            self.busy, self.last = False, self.loop.time()

    def _look(self) -> None:
        every = self.keepalive.every
        wait = every  # a send in progress (a slow reader) is not silence: look again a period later
        if not self.busy and self.sending is None:
            quiet = self.loop.time() - self.last
            if quiet >= every:
                self.sending = asyncio.ensure_future(self._ping())
            else:
                wait = every - quiet
        self.timer = self.loop.call_later(wait, self._look)

    async def _ping(self) -> None:
        try:
            await self.send({"type": "http.response.body", "body": self.keepalive.frame, "more_body": True})
            self.last = self.loop.time()
        finally:
            self.sending = None

    def stop(self) -> None:
        self.timer.cancel()
        if self.sending is not None:
            self.sending.cancel()
