"""POST /rerank (/v1/rerank, /v2/rerank), /score (/v1/score) and /classify: the pooling endpoints beyond
embeddings, each on its role's engine (choir/engine/roles.py)."""

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from litestar import Request, Response
from litestar.params import SkipValidation

from choir.app.routes.begin import begin
from choir.app.routes.disconnect import unless_disconnected
from choir.app.routes.replies import json_response
from choir.app.serving.classify import classify
from choir.app.serving.scoring import rerank, score
from choir.core.protocol.pooling import ClassificationRequest, RerankRequest, ScoreRequest
from choir.plugins.pipeline import Pipeline, PipelineDependency
from choir.plugins.spec import operation

T = TypeVar("T")


@operation("rerank", "rerankV1", "rerankV2")
async def create_rerank(data: SkipValidation[RerankRequest], request: Request,
                        pipeline: PipelineDependency) -> Response:
    return await _answer(request, pipeline, data, RerankRequest, "rerank-", rerank)


@operation("score", "scoreV1")
async def create_score(data: SkipValidation[ScoreRequest], request: Request, pipeline: PipelineDependency) -> Response:
    return await _answer(request, pipeline, data, ScoreRequest, "score-", score)


@operation("classify")
async def create_classification(data: SkipValidation[ClassificationRequest], request: Request,
                                pipeline: PipelineDependency) -> Response:
    return await _answer(request, pipeline, data, ClassificationRequest, "classify-", classify)


async def _answer(request: Request, pipeline: Pipeline, data: Any, wire_type: type[T], prefix: str,
                  serve: Callable[[Pipeline, T, str], Awaitable[Any]]) -> Response:
    begun = begin(request, pipeline, data, wire_type, prefix)

    async def answer() -> Response:
        return json_response(await serve(pipeline, begun.body, begun.response_id), begun.base_id)

    return await unless_disconnected(request.receive, answer())
