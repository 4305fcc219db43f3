"""Response ids: the caller's X-Request-Id when given (and echoed back), else the body's `request_id`
(vLLM's field), else a random one."""

import os
import time

from litestar import Request

HEADER = "x-request-id"
_HEADER_KEY = HEADER.encode()


def request_base_id(request: Request, body_id: str | None = None) -> str:
    given = next((value for name, value in request.scope["headers"] if name == _HEADER_KEY), None)
    if given:
        return given.decode("latin-1")
    return body_id or os.urandom(16).hex()  # a uuid4's 32 hex digits, cheaper


def now() -> int:
    return int(time.time())
