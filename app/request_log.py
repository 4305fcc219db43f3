"""structlog set-up and one JSON line per request: never per SSE chunk, and no bodies."""

import logging
import time

import structlog
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send

log = structlog.get_logger("choir.request")


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
    scopes = (ScopeType.HTTP,)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        started = time.perf_counter()
        state = scope.setdefault("state", {})  # handlers record ids and token counts here
        status = 500

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await next_app(scope, receive, send_and_watch)
        finally:
            tokens = state.get("tokens")
            log.info(
                "request",
                method=scope["method"],
                path=scope["path"],
                status=status,
                request_id=state.get("response_id"),
                latency_ms=round((time.perf_counter() - started) * 1000, 2),
                prompt_tokens=tokens and tokens.prompt_tokens,
                completion_tokens=tokens and tokens.completion_tokens,
            )
