"""Choir's error types, free of any web framework: what its own code raises, and what the engine seam
raises. choir/app/errors.py turns these (and Litestar's, and the unexpected) into OpenAI's error shape, or on the
Anthropic routes into Anthropic's."""

import re
from http import HTTPStatus
from typing import Literal

from choir.core.protocol.common import ErrorDetail, ErrorResponse
from choir.core.protocol.messages import AnthropicError, AnthropicErrorDetail

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    499: "ClientClosedRequestError",  # nginx's status for a client that left: only ever logged
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
# Anthropic's error types by status (any other 4xx is an invalid_request_error, any other 5xx an api_error).
ANTHROPIC_ERROR_TYPES = {
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
OVERLOADED = 529  # Anthropic's status for "try again": a dead or saturated engine (503 elsewhere in Choir)
_INDEX, _DOTTED = re.compile(r"\[(\d+)\]"), r".\1"  # messages[2] → messages.2


class APIError(Exception):
    """An answer in OpenAI's error shape: the status, a message for the client, the field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers: dict[str, str] = {}

    @property
    def body(self) -> ErrorResponse:
        error_type = ERROR_TYPES.get(self.status) or HTTPStatus(self.status).phrase.replace(" ", "") + "Error"
        return ErrorResponse(ErrorDetail(message=self.message, type=error_type, param=self.param, code=self.status))

    def renamed(self, param: str, message: str) -> "APIError":
        """The same error about `param` (another API's name for the field), told in `message`."""
        renamed = APIError(self.status, message, param)
        renamed.headers = self.headers
        return renamed

    def anthropic(self, request_id: str | None) -> tuple[int, AnthropicError]:
        """The status and body in Anthropic's shape. It has no `param`: the message starts with the field, as
        Anthropic's do (`messages.0.content.1: ...`). A 503 is a 529 (overloaded), which Anthropic's clients retry."""
        status = OVERLOADED if self.status == 503 else self.status
        kind = ANTHROPIC_ERROR_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
        message, field = self.message, _INDEX.sub(_DOTTED, self.param) if self.param else None
        if field and f"`{self.param}`" in message:
            message = message.replace(f"`{self.param}`", f"`{field}`")  # named in the message already
        elif field:
            message = f"{field}: {message}"
        return status, AnthropicError(AnthropicErrorDetail(kind, message), request_id)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


class PromptTooLong(APIError):
    """A prompt that leaves the model no room for output (a 400): what `truncation: "auto"` cuts. `tokens` and
    `limit`, where known: the prompt's length and the context's (Claude Code reads them from its message)."""

    def __init__(self, message: str, param: str | None = None, tokens: int | None = None,
                 limit: int | None = None) -> None:
        super().__init__(400, message, param)
        self.tokens, self.limit = tokens, limit


def stopped_by_server() -> APIError:
    """A request the engine aborted on its own: the server is draining for shutdown (Choir aborts only
    what it cancels, and then never reads on). Said as an error, never as a normal finish."""
    return APIError(503, "The server stopped this request: it is shutting down. Retry on another instance.")


class EngineDead(Exception):
    """The engine can no longer serve requests."""


class EngineRejected(Exception):
    """The engine refused a request: as invalid (vLLM's validation: a token id out of vocabulary, too many
    logprobs, a grammar it cannot compile; 400), or for now (its queue is full; 503). The message is
    vLLM's, without its internals."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


class AdapterError(Exception):
    """A LoRA adapter cannot be loaded (its message says why): its name is taken, or its path holds no
    adapter this engine can load (`about`)."""

    def __init__(self, message: str, about: Literal["name", "path"] = "path") -> None:
        super().__init__(message)
        self.about = about


class UnknownAdapter(LookupError):
    """No LoRA adapter of this name is loaded."""
