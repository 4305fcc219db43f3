"""Response ids: the caller's X-Request-Id when given (and echoed back), else a random one."""

import time
import uuid

from litestar import Request

HEADER = "x-request-id"


def request_base_id(request: Request) -> str:
    return request.headers.get(HEADER) or uuid.uuid4().hex


def now() -> int:
    return int(time.time())
