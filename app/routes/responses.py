"""A job's result as a Litestar response: JSON, or SSE whose events are the chunks then [DONE]."""

from collections.abc import AsyncIterator

from litestar import Response
from litestar.response import ServerSentEvent

from app.routes.request_ids import HEADER
from app.serving.streaming import sse_data


def json_response(body: object, base_id: str) -> Response:
    return Response(body, headers={HEADER: base_id})


def sse_response(chunks: AsyncIterator[bytes], base_id: str) -> ServerSentEvent:
    return ServerSentEvent(sse_data(chunks), headers={HEADER: base_id})
