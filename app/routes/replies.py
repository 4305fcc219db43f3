"""A job's result as a Litestar response: JSON, or SSE whose events are the chunks then [DONE]."""

from collections.abc import AsyncIterator, Callable

from litestar import Response
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from app.routes.request_ids import HEADER
from app.serving.streaming import sse_data


def json_response(body: object, base_id: str) -> Response:
    return Response(body, headers={HEADER: base_id})


def sse_response(chunks: AsyncIterator[bytes], base_id: str) -> ServerSentEvent:
    return ServerSentEvent(sse_data(chunks), headers={HEADER: base_id})


def event_stream_response(events: AsyncIterator[tuple[str, bytes]], base_id: str,
                          on_error: Callable[[Exception], tuple[str, bytes]]) -> ServerSentEvent:
    """Named SSE events (`event: <type>`), as the Responses API streams them; no [DONE]."""

    async def messages() -> AsyncIterator[ServerSentEventMessage]:
        try:
            async for name, data in events:
                yield ServerSentEventMessage(data=data.decode(), event=name)
        except Exception as exc:  # the stream has started: the failure is its last event
            name, data = on_error(exc)
            yield ServerSentEventMessage(data=data.decode(), event=name)
        finally:
            await events.aclose()

    return ServerSentEvent(messages(), headers={HEADER: base_id})
