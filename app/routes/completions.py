from litestar import Request, Response
from litestar.params import SkipValidation

from app.protocol import parse_strict
from app.protocol.completions import CompletionRequest
from app.request_log import annotate
from app.routes.disconnect import unless_disconnected
from app.routes.replies import json_response, sse_response
from app.routes.request_ids import now, request_base_id
from app.serving.completions import complete, plan_completion, stream_completion
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("createCompletion")
async def create_completion(data: SkipValidation[CompletionRequest], request: Request,
                            pipeline: PipelineDependency) -> Response:
    compat, fan_out, engine, aggregator = pipeline.compat, pipeline.fan_out, pipeline.engine, pipeline.aggregator
    compat.check_body(data, CompletionRequest)
    data = parse_strict(data, CompletionRequest)
    base_id = request_base_id(request, data.request_id)
    response_id = f"cmpl-{base_id}"
    annotate(request.scope, response_id=response_id)

    async def answer() -> Response:
        job = await plan_completion(engine, fan_out, compat, data, response_id, now())
        annotate(request.scope, tokens=job.counts)
        if data.stream:
            return await sse_response(stream_completion(engine, aggregator, job), base_id)
        return json_response(await complete(engine, aggregator, job), base_id)

    return await unless_disconnected(request.receive, answer())
