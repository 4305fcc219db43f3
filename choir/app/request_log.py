"""structlog set-up and one JSON line per request: never per SSE chunk, and no bodies."""

import logging
import sys
import time
from typing import TextIO

import structlog
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

from choir.plugins.metrics import record_request

log = structlog.get_logger("choir.request")
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))


def annotate(scope: Scope, **fields: object) -> None:
    """What a handler adds to its request's log line: `response_id`, `tokens`. Into the scope's state
    directly: each `request.state` access builds a Litestar State (with a lock) of its own."""
    scope["state"].update(fields)


def configure_logging(level: str, file: TextIO | None = None) -> None:
    """JSON lines on stdout (or `file`). Each line is written whole, its newline included: structlog's default
    PrintLogger writes the newline apart, and a line of another process sharing the log (API processes, vLLM's
    engine) could land between the two."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=lambda *_: structlog.WriteLogger(file or sys.stdout),  # sys.stdout as it is then
        cache_logger_on_first_use=False,  # one line per request: caching buys little, and tests can capture
    )
    # RequestLogMiddleware logs every request once; uvicorn's access log would be a second line.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


async def watch_request(scope: Scope, receive: Receive, send: Send, app: ASGIApp,
                        quiet: frozenset[str] = frozenset()) -> None:
    """Runs `app` on one HTTP request and watches it: one log line and its metrics (choir/plugins/metrics.py),
    whatever ends it: a handler, an error, the 401 of the auth middleware, the router's 404 or 405, a
    client that leaves (`client_left`; 499 when no response had started). Wrapped around the whole app
    (choir/app/asgi.py), outside Litestar's middleware, which the router's answers never reach. One wrapper around
    `send` for both, since a stream passes every chunk through it; no header is logged (the key is one). A path
    in `quiet` (vLLM's --disable-access-log-for-endpoints) is counted, not logged."""
    started = time.perf_counter()
    state = scope.setdefault("state", {})  # handlers record ids and token counts here
    status, first_chunk_at, streaming, done, left = 500, None, False, False, False

    async def send_and_watch(message: Message) -> None:
        nonlocal status, first_chunk_at, streaming, done
        if message["type"] == "http.response.start":
            status = message["status"]
            streaming = any(k == b"content-type" and v.startswith(b"text/event-stream")
                            for k, v in message.get("headers", ()))
        elif message["type"] == "http.response.body":
            if streaming and first_chunk_at is None and message.get("body"):
                first_chunk_at = time.perf_counter()
            done = not message.get("more_body", False)
        await send(message)

    async def receive_and_watch() -> ReceiveMessage:
        nonlocal left
        message = await receive()
        if message["type"] == "http.disconnect" and not done:  # uvicorn also says so once the answer is sent
            left = True
        return message

    try:
        await app(scope, receive_and_watch, send_and_watch)
    finally:
        latency = time.perf_counter() - started
        method = str(scope.get("method", ""))
        method = method if method in METHODS else "OTHER"  # a label: never a client's own token
        # Never the request's path as a label (a caller could make one series per path it tries): the operation,
        # else the route's template, which the router set (as choir/plugins/auth.py reads it).
        route = (getattr(scope.get("route_handler"), "operation_id", None) or scope.get("path_template")
                 or "unmatched")
        record_request(route, method, status, latency, None if first_chunk_at is None else first_chunk_at - started)
        tokens = state.get("tokens")
        if scope["path"] not in quiet:
            log.info(
                "request",
                method=method,
                path=scope["path"],
                status=status,
                request_id=state.get("response_id"),
                latency_ms=round(latency * 1000, 2),
                prompt_tokens=tokens and tokens.prompt_tokens,
                completion_tokens=tokens and tokens.completion_tokens,
                **({"client_left": True} if left else {}),
            )
