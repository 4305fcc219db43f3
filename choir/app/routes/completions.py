from litestar import Request, Response
from litestar.params import SkipValidation

from choir.app.request_ids import now
from choir.app.routes.begin import begin, counted
from choir.app.routes.disconnect import unless_disconnected
from choir.app.routes.replies import json_response, sse_response
from choir.app.serving.completions import complete, plan_completion, stream_completion
from choir.core.protocol.completions import CompletionRequest
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation


@operation("createCompletion")
async def create_completion(data: SkipValidation[CompletionRequest], request: Request,
                            pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, CompletionRequest, "cmpl-")
    engine, aggregator = pipeline.engine, pipeline.aggregator

    async def answer() -> Response:
        job = await plan_completion(pipeline, begun.body, begun.response_id, now())
        counts = counted(request, job)
        if begun.body.stream:
            return await sse_response(stream_completion(engine, aggregator, job, counts), begun.base_id,
                                      begun.response_id)
        return json_response(await complete(engine, aggregator, job, counts), begun.base_id)

    return await unless_disconnected(request.receive, answer())
