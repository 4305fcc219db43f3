"""Every error Choir returns has OpenAI's shape: {"error": {"message", "type", "param", "code"}}, but on the
routes the spec marks `x-choir-errors: anthropic` (the Messages API), where it has Anthropic's:
{"type": "error", "error": {"type", "message"}, "request_id"}, with a `request-id` header.

`APIError` (choir/core/errors.py) is what Choir's own code raises; `error_for` turns any exception into one,
so that responses and in-stream error events share a single mapping: Litestar's routing and
validation errors are 4xx, the engine's refusals (`EngineRejected`, vLLM's validation) 4xx, a dead
engine 503, and anything else, a bug, is a 500 with a generic message and the request id, the
traceback in the log.
"""

import re

import msgspec
import structlog
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException

from choir.app.request_ids import request_base_id
from choir.core.errors import APIError, EngineDead, EngineRejected, bad_request
from choir.plugins.spec import error_shapes, routed_path

log = structlog.get_logger("choir.errors")

_MSGSPEC_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`")
_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")


def error_for(exc: BaseException, request_id: str | None = None) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValidationException):
        return _validation_error(exc)
    if isinstance(exc, msgspec.ValidationError):
        return _field_error(str(exc), None)
    if isinstance(exc, HTTPException):
        return _http_error(exc)
    if isinstance(exc, EngineRejected):
        return APIError(exc.status, exc.message, exc.param)
    if isinstance(exc, EngineDead):
        return APIError(503, "The engine is not running; the server cannot answer this request. Retry once it is "
                              "healthy.")
    log.error("unhandled error", request_id=request_id, exc_info=exc)
    which = f" (request {request_id})" if request_id else ""
    return APIError(500, f"Internal server error{which}. The server log has the details.")


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
    missing = _MISSING_FIELD.match(message)
    if missing:  # the field that is missing, where it is missing
        key = f"{key}.{missing['field']}" if key else missing["field"]
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


def _caused_by(exc: BaseException, types: tuple[type[BaseException], ...]) -> bool:
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, types):
            return True
        current = current.__cause__ or current.__context__
    return False


def error_json(exc: BaseException, request_id: str | None = None) -> bytes:
    return msgspec.json.encode(error_for(exc, request_id).body)


def anthropic_error_json(exc: BaseException, request_id: str | None = None) -> bytes:
    return msgspec.json.encode(error_for(exc, request_id).anthropic(request_id)[1])


ANTHROPIC_REQUEST_ID = "request-id"  # the header Anthropic's SDKs read a request's id from


def _shape(request: Request) -> str:
    handler = request.scope.get("route_handler")  # absent when no route matched (a 404, a 405)
    if handler is not None:
        return handler.opt.get("errors", "openai")
    return error_shapes().get(routed_path(request.scope), "openai")


def exception_handler(request: Request, exc: Exception) -> Response:
    # Every request has an id to quote, also those that fail before a handler named theirs (or
    # that have no response id at all: /tokenize, /v1/models): the request log line gets it too.
    state = request.scope.setdefault("state", {})
    named = state.get("response_id")
    anthropic = _shape(request) == "anthropic"
    request_id = named or (f"req_{request_base_id(request)}" if anthropic else request_base_id(request))
    state["response_id"] = request_id
    error = error_for(exc, request_id)
    headers = {**(getattr(exc, "headers", None) or {}), **error.headers}
    if anthropic:
        status, body = error.anthropic(request_id)
        headers[ANTHROPIC_REQUEST_ID] = request_id
        return Response(content=body, status_code=status, media_type=MediaType.JSON, headers=headers)
    return Response(content=error.body, status_code=error.status, media_type=MediaType.JSON, headers=headers)
