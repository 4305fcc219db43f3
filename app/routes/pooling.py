"""POST /rerank (/v1/rerank, /v2/rerank), /score (/v1/score) and /classify: the pooling endpoints beyond
embeddings, each on its role's engine (plugins/engine/roles.py)."""

from litestar import Request, Response
from litestar.params import SkipValidation

from app.routes.begin import begin
from app.routes.disconnect import unless_disconnected
from app.routes.replies import json_response
from app.serving.classify import classify
from app.serving.scoring import rerank, score
from core.protocol.pooling import ClassificationRequest, RerankRequest, ScoreRequest
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("rerank", "rerankV1", "rerankV2")
async def create_rerank(data: SkipValidation[RerankRequest], request: Request,
                        pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, RerankRequest, "rerank-")

    async def answer() -> Response:
        return json_response(await rerank(pipeline, begun.body, begun.response_id), begun.base_id)

    return await unless_disconnected(request.receive, answer())


@operation("score", "scoreV1")
async def create_score(data: SkipValidation[ScoreRequest], request: Request, pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, ScoreRequest, "score-")

    async def answer() -> Response:
        return json_response(await score(pipeline, begun.body, begun.response_id), begun.base_id)

    return await unless_disconnected(request.receive, answer())


@operation("classify")
async def create_classification(data: SkipValidation[ClassificationRequest], request: Request,
                                pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, ClassificationRequest, "classify-")

    async def answer() -> Response:
        return json_response(await classify(pipeline, begun.body, begun.response_id), begun.base_id)

    return await unless_disconnected(request.receive, answer())
