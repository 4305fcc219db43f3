from litestar import Request, Response
from litestar.params import SkipValidation

from choir.app.routes.begin import begin
from choir.app.routes.disconnect import unless_disconnected
from choir.app.routes.replies import json_response
from choir.app.serving.embeddings import embed, plan_embeddings
from choir.core.protocol.embeddings import EmbeddingRequest
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation


@operation("createEmbedding")
async def create_embedding(data: SkipValidation[EmbeddingRequest], request: Request,
                           pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, EmbeddingRequest, "embd-")

    async def answer() -> Response:
        model, prompts = await plan_embeddings(pipeline, begun.body)
        return json_response(await embed(pipeline, begun.body, model, prompts, begun.response_id), begun.base_id)

    return await unless_disconnected(request.receive, answer())
