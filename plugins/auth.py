"""Bearer API keys (CHOIR_API_KEY): every /v1 route needs `Authorization: Bearer <key>`.

The check runs before anything else decides about the request: in a middleware for the routes
that exist, and ahead of the 404/405 answer for those that do not, so a caller without a key
learns nothing about the routes. Keys are compared in constant time (digests, every key tried).
"""

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response
from litestar.config.app import AppConfig
from litestar.enums import ScopeType
from litestar.exceptions import MethodNotAllowedException, NotFoundException
from litestar.middleware import ASGIMiddleware
from litestar.plugins import InitPlugin
from litestar.types import ASGIApp, Receive, Scope, Send

from core.errors import APIError

# vLLM leaves the tokenizer and SageMaker's /invocations open: the model's text, and all of /v1 behind one path
PROTECTED = ("/v1", "/tokenize", "/detokenize", "/invocations")
DOCS = ("/schema",)
METRICS = ("/metrics",)


@dataclass(frozen=True)
class AuthConfig:
    api_keys: tuple[str, ...]
    protect_docs: bool = False
    protect_metrics: bool = False

    @property
    def prefixes(self) -> tuple[str, ...]:
        return PROTECTED + (DOCS if self.protect_docs else ()) + (METRICS if self.protect_metrics else ())

    def protects(self, path: str) -> bool:
        return any(path == prefix or path.startswith(prefix + "/") for prefix in self.prefixes)

    def failure(self, path: str, authorization: str | None) -> APIError | None:
        """The 401 to answer, or None when the request may go on."""
        if not self.api_keys or not self.protects(path):
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthorized("Missing API key: send `Authorization: Bearer <key>`.")
        offered = hashlib.sha256(token.strip().encode()).digest()
        matched = False
        for key in self.api_keys:  # no early exit: the time does not tell which key came close
            matched |= hmac.compare_digest(offered, hashlib.sha256(key.encode()).digest())
        return None if matched else _unauthorized("Invalid API key.")


def _unauthorized(message: str) -> APIError:
    error = APIError(401, message)
    error.headers = {"WWW-Authenticate": "Bearer"}
    return error


class BearerAuthMiddleware(ASGIMiddleware):
    scopes = (ScopeType.HTTP,)

    def __init__(self, config: AuthConfig) -> None:
        self.config = config

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        authorization = next((v.decode() for k, v in scope["headers"] if k == b"authorization"), None)
        failure = self.config.failure(scope["path"], authorization)
        if failure is not None:
            raise failure
        await next_app(scope, receive, send)


def _auth_first(config: AuthConfig, handler: Callable[[Request, Exception], Response]) -> Callable[..., Response]:
    """Unknown routes and methods: a 401 comes before the 404 or 405."""

    def handle(request: Request, exc: Exception) -> Response:
        failure = config.failure(request.scope["path"], request.headers.get("authorization"))
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
