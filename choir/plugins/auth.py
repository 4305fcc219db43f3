"""API keys (CHOIR_API_KEY): with keys set, every path needs `Authorization: Bearer <key>` (OpenAI's clients)
or `x-api-key: <key>` (Anthropic's) but the few that are open (the probes: health, ping, ready, load, version;
and unless set otherwise the docs and /metrics).

Closed by default, so a caller without a key learns nothing about the routes: an unknown path is a 401 as a
known one is, before any 404 or 405, however it is spelt. What is open is decided from what the router
decided, never from a rewritten path (a path parameter may hold `..%2F`): for a route that exists, in a
middleware, from the route's own path template; for a 404/405, from the path as the router normalised it.
Keys are compared in constant time (digests, every key tried), as bytes: a header that is not UTF-8 is just
a wrong key.
"""

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.config.app import AppConfig
from litestar.enums import ScopeType
from litestar.exceptions import MethodNotAllowedException, NotFoundException
from litestar.middleware import ASGIMiddleware
from litestar.plugins import InitPlugin
from litestar.types import ASGIApp, Receive, Scope, Send, WebSocketResponseBodyEvent, WebSocketResponseStartEvent

from choir.core.errors import APIError
from choir.plugins.spec import routed_path

OPEN = ("/health", "/ping", "/ready", "/load", "/version")  # the probes a cluster reads without a key
DOCS = "/schema"  # and everything below it: the docs page's assets, openapi.json
METRICS = "/metrics"


@dataclass(frozen=True)
class AuthConfig:
    api_keys: tuple[str, ...]
    protect_docs: bool = False
    protect_metrics: bool = False

    def is_open(self, path: str) -> bool:
        """`path`: a route's path template, or a request's path as the router normalised it."""
        if path in OPEN or (path == METRICS and not self.protect_metrics):
            return True
        return not self.protect_docs and (path == DOCS or path.startswith(DOCS + "/"))

    def failure(self, open_: bool, key: bytes | None) -> APIError | None:
        """The 401 to answer, or None when the request may go on. `key`: the one the request offers (`api_key`)."""
        if not self.api_keys or open_:
            return None
        if not key:
            return _unauthorized("Missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`).")
        offered = hashlib.sha256(key).digest()
        matched = False
        for each in self.api_keys:  # no early exit: the time does not tell which key came close
            matched |= hmac.compare_digest(offered, hashlib.sha256(each.encode()).digest())
        return None if matched else _unauthorized("Invalid API key.")


# A scope key only this process sets (no header or client can): the owner an in-process request acts for, as the
# digest of the API key that made the batch it answers (choir/app/serving/batch_runner.py).
INTERNAL_OWNER = "choir.owner"


def api_key(scope: Scope) -> bytes | None:
    """The key a request offers: `Authorization: Bearer <key>`, else `x-api-key: <key>` (Claude Code sends the one
    its settings name; the anthropic SDK 2.16 a Bearer token)."""
    bearer = other = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            bearer = token.strip() if scheme.lower() == b"bearer" else None
        elif name == b"x-api-key":
            other = value.strip()
    return bearer or other or None


async def _deny_websocket(scope: Scope, send: Send, failure: APIError) -> None:
    """A handshake without the key: the 401 in OpenAI's error shape where the server can answer a handshake with a
    response (uvicorn's, as vLLM's server answers it), else the handshake refused (a 403)."""
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008, "reason": failure.message[:120]})
        return
    headers = [(b"content-type", b"application/json"),
               *((name.lower().encode(), value.encode()) for name, value in failure.headers.items())]
    start: WebSocketResponseStartEvent = {"type": "websocket.http.response.start", "status": failure.status,
                                          "headers": headers}
    await send(start)
    body: WebSocketResponseBodyEvent = {"type": "websocket.http.response.body",
                                        "body": msgspec.json.encode(failure.body), "more_body": False}
    await send(body)


def _unauthorized(message: str) -> APIError:
    error = APIError(401, message)
    error.headers = {"WWW-Authenticate": "Bearer"}
    return error


class BearerAuthMiddleware(ASGIMiddleware):
    scopes = (ScopeType.HTTP, ScopeType.WEBSOCKET)

    def __init__(self, config: AuthConfig) -> None:
        self.config = config

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        if INTERNAL_OWNER in scope:  # a request this process makes for an owner (a batch's line): no HTTP client
            await next_app(scope, receive, send)
            return
        # The route's template (`/v1/models/{model}`), which the router set: no client's spelling.
        failure = self.config.failure(self.config.is_open(scope["path_template"]), api_key(scope))
        if failure is None:
            await next_app(scope, receive, send)
        elif scope["type"] == ScopeType.WEBSOCKET:
            await _deny_websocket(scope, send, failure)
        else:
            raise failure


def _auth_first(config: AuthConfig, handler: Callable[[Request, Exception], Response]) -> Callable[..., Response]:
    """Unknown routes and methods: a 401 comes before the 404 or 405."""

    def handle(request: Request, exc: Exception) -> Response:
        scope = request.scope
        failure = config.failure(config.is_open(routed_path(scope)), api_key(scope))
        return handler(request, failure or exc)

    return handle


class AuthPlugin(InitPlugin):
    __slots__ = ("config",)

    def __init__(self, config: AuthConfig) -> None:
        self.config = config

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        if not self.config.api_keys:
            return app_config
        app_config.middleware.insert(0, BearerAuthMiddleware(self.config))
        fallback: Any = app_config.exception_handlers.get(Exception)
        for exc_type in (NotFoundException, MethodNotAllowedException):
            handler = app_config.exception_handlers.get(exc_type, fallback)
            app_config.exception_handlers[exc_type] = _auth_first(self.config, handler)
        return app_config
