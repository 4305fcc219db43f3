"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API (choir/app/serving/messages.py).

Errors on these routes have Anthropic's shape (the spec marks them `x-choir-errors: anthropic`), and every
answer carries a `request-id` header, as Anthropic's do.
"""

from litestar import Request, Response
from litestar.params import SkipValidation

from choir.app.errors import ANTHROPIC_REQUEST_ID, anthropic_error_json
from choir.app.request_ids import now
from choir.app.routes.begin import begin, counted
from choir.app.routes.disconnect import unless_disconnected
from choir.app.routes.event_stream import Keepalive
from choir.app.routes.replies import event_stream_response, json_response
from choir.app.serving.message_events import answer_message, stream_message
from choir.app.serving.messages import count_tokens, plan_message
from choir.app.serving.streaming import named_frame
from choir.core.errors import PromptTooLong
from choir.core.protocol.messages import CountTokensRequest, CountTokensResponse, MessagesRequest
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation

# A quiet stream gets a ping every 10 s: a long prefill or long thinking never trips a client's idle timeout.
PING = Keepalive(named_frame("ping", b'{"type":"ping"}'), 10.0)


@operation("createMessage")
async def create_message(data: SkipValidation[MessagesRequest], request: Request,
                         pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, MessagesRequest, "msg_")
    headers = {ANTHROPIC_REQUEST_ID: begun.response_id}

    async def answer() -> Response:
        job, builder = await plan_message(pipeline, begun.body, begun.response_id, now())
        counts = counted(request, job)
        if begun.body.stream:
            return await event_stream_response(
                stream_message(pipeline.aggregator, job, builder, counts), begun.base_id,
                lambda exc: named_frame("error", anthropic_error_json(exc, begun.response_id)), headers=headers,
                keepalive=PING)
        return json_response(await answer_message(pipeline.aggregator, job, builder, counts), begun.base_id, headers)

    return await unless_disconnected(request.receive, answer())


@operation("countMessageTokens")
async def count_message_tokens(data: SkipValidation[CountTokensRequest], request: Request,
                               pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, CountTokensRequest, "req_")
    try:
        tokens = await count_tokens(pipeline, begun.body, begun.response_id, now())
    except PromptTooLong as exc:  # counted all the same: a client counts to learn whether it fits
        if exc.tokens is None:
            raise
        tokens = exc.tokens
    return json_response(CountTokensResponse(input_tokens=tokens), begun.base_id,
                         {ANTHROPIC_REQUEST_ID: begun.response_id})
