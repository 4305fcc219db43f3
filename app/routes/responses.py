from litestar import Request, Response
from litestar.params import SkipValidation

from app.protocol import parse_strict
from app.protocol.responses import ResponsesRequest
from app.request_log import annotate
from app.routes.disconnect import unless_disconnected
from app.routes.replies import event_stream_response, json_response
from app.routes.request_ids import now, request_base_id
from app.serving.responses import plan_response, respond, stream_response
from app.serving.streaming import named_frame
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("createResponse")
async def create_response(data: SkipValidation[ResponsesRequest], request: Request,
                          pipeline: PipelineDependency) -> Response:
    compat, fan_out, engine, aggregator = pipeline.compat, pipeline.fan_out, pipeline.engine, pipeline.aggregator
    compat.check_body(data, ResponsesRequest)
    data = parse_strict(data, ResponsesRequest)
    base_id = request_base_id(request)
    response_id = f"resp_{base_id}"
    annotate(request.scope, response_id=response_id)

    async def answer() -> Response:
        job, builder = await plan_response(engine, fan_out, compat, data, response_id, now())
        annotate(request.scope, tokens=job.counts)
        if data.stream:
            return await event_stream_response(stream_response(aggregator, job, builder), base_id,
                                               lambda exc: named_frame(*builder.failed(exc)))
        return json_response(await respond(aggregator, job, builder), base_id)

    return await unless_disconnected(request.receive, answer())
