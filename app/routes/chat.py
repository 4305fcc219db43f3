from litestar import Request, Response
from litestar.params import SkipValidation

from app.request_ids import now
from app.routes.begin import begin, counted
from app.routes.disconnect import unless_disconnected
from app.routes.replies import json_response, sse_response
from app.serving.chat import complete_chat, plan_chat, stream_chat
from core.protocol.chat import ChatCompletionRequest
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("createChatCompletion")
async def create_chat_completion(data: SkipValidation[ChatCompletionRequest], request: Request,
                                 pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, ChatCompletionRequest, "chatcmpl-")

    async def answer() -> Response:
        job = await plan_chat(pipeline, begun.body, begun.response_id, now())
        counts = counted(request, job)
        if begun.body.stream:
            return await sse_response(stream_chat(pipeline.aggregator, job, counts), begun.base_id,
                                      begun.response_id)
        return json_response(await complete_chat(pipeline.aggregator, job, counts), begun.base_id)

    return await unless_disconnected(request.receive, answer())
