"""Every error Choir returns has OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

`APIError` is what Choir's own code raises; `error_for` turns any exception (Litestar's
routing and validation errors, vLLM's, unexpected ones) into one, so that responses and
in-stream error events share a single mapping.
"""

import re
from http import HTTPStatus

import msgspec
import structlog
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException

from app.protocol.common import ErrorDetail, ErrorResponse
from plugins.engine.protocol import EngineDead

log = structlog.get_logger("choir.errors")

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
_MSGSPEC_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers: dict[str, str] = {}

    @property
    def body(self) -> ErrorResponse:
        error_type = ERROR_TYPES.get(self.status, HTTPStatus(self.status).phrase.replace(" ", "") + "Error")
        return ErrorResponse(ErrorDetail(message=self.message, type=error_type, param=self.param, code=self.status))


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def error_for(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValidationException):
        return _validation_error(exc)
    if isinstance(exc, msgspec.ValidationError):
        return _field_error(str(exc), None)
    if isinstance(exc, HTTPException):
        return _http_error(exc)
    if isinstance(exc, EngineDead):
        return APIError(503, "The engine is not running; the server cannot generate. Retry once it is healthy.")
    if isinstance(exc, (ValueError, TypeError, OverflowError)) or _is_vllm_client_error(exc):
        # vLLM reports invalid requests (token ids out of vocabulary, too many logprobs) so.
        param = getattr(exc, "parameter", None)
        return bad_request(str(exc).split(" (parameter=")[0], param)
    log.error("unhandled error", exc_info=exc)
    return APIError(500, f"Internal server error ({type(exc).__name__}). The server log has the details.")


def _validation_error(exc: ValidationException) -> APIError:
    extra = exc.extra if isinstance(exc.extra, list) else []
    if not extra:  # e.g. a body that is not JSON at all
        return bad_request(f"The request body is not valid JSON: {exc.detail}.")
    first = extra[0] if isinstance(extra[0], dict) else {}
    return _field_error(str(first.get("message") or exc.detail), first.get("key"))


def _field_error(message: str, key: str | None) -> APIError:
    match = _MSGSPEC_PATH.search(message)
    if match:  # msgspec names the field as a JSON path: `$.messages[0].role`, `$.logit_bias[...]` (a value)
        key = match["path"].replace("[...]", "").lstrip(".") or None
        message = message[: match.start()]
    text = f"Invalid request: {message}" + (f" (field `{key}`)." if key else ".")
    return bad_request(text, key)


def _http_error(exc: HTTPException) -> APIError:
    status = exc.status_code
    if status == 400 and _caused_by(exc, (SerializationException, msgspec.DecodeError)):
        return bad_request(f"The request body is not valid JSON: {exc.detail}.")
    if status == 404:
        return APIError(404, f"{exc.detail}. See GET /schema for the routes this server has.")
    if status == 405:
        return APIError(405, f"{exc.detail}. See GET /schema for the methods each route accepts.")
    if status == 413:
        return APIError(413, "The request body is larger than this server accepts (CHOIR_MAX_BODY_BYTES).")
    return APIError(status, str(exc.detail))


def _is_vllm_client_error(exc: BaseException) -> bool:
    return any(cls.__name__ == "VLLMClientError" for cls in type(exc).__mro__)  # without importing vLLM


def _caused_by(exc: BaseException, types: tuple[type[BaseException], ...]) -> bool:
    while exc is not None:
        if isinstance(exc, types):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def error_json(exc: BaseException) -> bytes:
    return msgspec.json.encode(error_for(exc).body)


def exception_handler(request: Request, exc: Exception) -> Response:
    error = error_for(exc)
    headers = {**(getattr(exc, "headers", None) or {}), **error.headers}
    return Response(content=error.body, status_code=error.status, media_type=MediaType.JSON, headers=headers)
