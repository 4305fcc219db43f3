from litestar import Request, Response
from litestar.params import SkipValidation

from app.protocol import parse_strict
from app.protocol.chat import ChatCompletionRequest
from app.request_log import annotate
from app.routes.disconnect import unless_disconnected
from app.routes.replies import json_response, sse_response
from app.routes.request_ids import now, request_base_id
from app.serving.chat import complete_chat, plan_chat, stream_chat
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("createChatCompletion")
async def create_chat_completion(data: SkipValidation[ChatCompletionRequest], request: Request,
                                 pipeline: PipelineDependency) -> Response:
    compat, fan_out, engine, aggregator = pipeline.compat, pipeline.fan_out, pipeline.engine, pipeline.aggregator
    compat.check_body(data, ChatCompletionRequest)
    data = parse_strict(data, ChatCompletionRequest)
    base_id = request_base_id(request, data.request_id)
    response_id = f"chatcmpl-{base_id}"
    annotate(request.scope, response_id=response_id)

    async def answer() -> Response:
        job = await plan_chat(engine, fan_out, compat, data, response_id, now())
        annotate(request.scope, tokens=job.counts)
        if data.stream:
            return await sse_response(stream_chat(aggregator, job), base_id)
        return json_response(await complete_chat(aggregator, job), base_id)

    return await unless_disconnected(request.receive, answer())
