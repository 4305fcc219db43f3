from litestar import Request, Response
from litestar.params import SkipValidation

from app.request_ids import now
from app.routes.begin import begin, counted
from app.routes.disconnect import unless_disconnected
from app.routes.replies import event_stream_response, json_response
from app.serving.responses import plan_response, respond, stream_response
from app.serving.streaming import named_frame
from core.protocol.responses import ResponsesRequest
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("createResponse")
async def create_response(data: SkipValidation[ResponsesRequest], request: Request,
                          pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, ResponsesRequest, "resp_")

    async def answer() -> Response:
        job, builder = await plan_response(pipeline, begun.body, begun.response_id, now())
        counts = counted(request, job)
        if begun.body.stream:
            return await event_stream_response(stream_response(pipeline.aggregator, job, builder, counts),
                                               begun.base_id, lambda exc: named_frame(*builder.failed(exc)))
        return json_response(await respond(pipeline.aggregator, job, builder, counts), begun.base_id)

    return await unless_disconnected(request.receive, answer())
