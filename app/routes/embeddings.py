from litestar import Request, Response
from litestar.params import SkipValidation

from app.routes.begin import begin
from app.routes.disconnect import unless_disconnected
from app.routes.replies import json_response
from app.serving.embeddings import embed, plan_embeddings
from core.protocol.embeddings import EmbeddingRequest
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("createEmbedding")
async def create_embedding(data: SkipValidation[EmbeddingRequest], request: Request,
                           pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, EmbeddingRequest, "embd-")

    async def answer() -> Response:
        model, prompts = await plan_embeddings(pipeline, begun.body)
        return json_response(await embed(pipeline, begun.body, model, prompts, begun.response_id), begun.base_id)

    return await unless_disconnected(request.receive, answer())
