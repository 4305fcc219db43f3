"""structlog set-up and one JSON line per request: never per SSE chunk, and no bodies."""

import logging
import time

import structlog
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from plugins.metrics import record_request

log = structlog.get_logger("choir.request")


def annotate(scope: Scope, **fields: object) -> None:
    """What a handler adds to its request's log line: `response_id`, `tokens`. Into the scope's state
    directly: each `request.state` access builds a Litestar State (with a lock) of its own."""
    scope["state"].update(fields)


def configure_logging(level: str) -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        cache_logger_on_first_use=False,  # one line per request: caching buys little, and tests can capture
    )
    # RequestLogMiddleware logs every request once; uvicorn's access log would be a second line.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


class RequestLogMiddleware(ASGIMiddleware):
    """Watches each request once: one log line, and its metrics (plugins/metrics.py). One wrapper
    around `send` for both, since a stream passes every chunk through it."""

    scopes = (ScopeType.HTTP,)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        started = time.perf_counter()
        state = scope.setdefault("state", {})  # handlers record ids and token counts here
        status, first_chunk_at, streaming = 500, None, False

        async def send_and_watch(message: Message) -> None:
            nonlocal status, first_chunk_at, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                streaming = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                for k, v in message.get("headers", ()))
            elif streaming and first_chunk_at is None and message.get("body"):
                first_chunk_at = time.perf_counter()
            await send(message)

        try:
            await next_app(scope, receive, send_and_watch)
        finally:
            latency = time.perf_counter() - started
            handler = scope.get("route_handler")
            method = str(scope.get("method", ""))  # HTTP scopes only (see `scopes`)
            record_request(getattr(handler, "operation_id", None) or scope["path"], method, status, latency,
                           None if first_chunk_at is None else first_chunk_at - started)
            tokens = state.get("tokens")
            log.info(
                "request",
                method=method,
                path=scope["path"],
                status=status,
                request_id=state.get("response_id"),
                latency_ms=round(latency * 1000, 2),
                prompt_tokens=tokens and tokens.prompt_tokens,
                completion_tokens=tokens and tokens.completion_tokens,
            )
