from litestar import Request, Response
from litestar.params import SkipValidation

from choir.app.request_ids import now
from choir.app.routes.begin import begin, counted
from choir.app.routes.disconnect import unless_disconnected
from choir.app.routes.replies import json_response, sse_response
from choir.app.serving.chat import complete_chat, plan_chat, stream_chat
from choir.app.serving.chat_batch import complete_batch, plan_batch
from choir.core.protocol.chat import BatchChatCompletionRequest, ChatCompletionRequest
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation


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


@operation("createBatchChatCompletion")
async def create_batch_chat_completion(data: SkipValidation[BatchChatCompletionRequest], request: Request,
                                       pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, BatchChatCompletionRequest, "chatcmpl-")

    async def answer() -> Response:
        jobs = await plan_batch(pipeline, begun.body, begun.response_id, now())
        counts = counted(request, jobs)
        return json_response(await complete_batch(pipeline.aggregator, jobs, begun.response_id, counts), begun.base_id)

    return await unless_disconnected(request.receive, answer())
