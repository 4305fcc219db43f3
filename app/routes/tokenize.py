from litestar import Request
from litestar.params import SkipValidation

from app.serving.tokenize import detokenize, tokenize
from core.protocol.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("tokenize")
async def create_tokens(data: SkipValidation[TokenizeRequest], request: Request,
                        pipeline: PipelineDependency) -> TokenizeResponse:
    return await tokenize(pipeline, pipeline.compat.admit(data, TokenizeRequest))


@operation("detokenize")
async def create_text(data: SkipValidation[DetokenizeRequest], request: Request,
                      pipeline: PipelineDependency) -> DetokenizeResponse:
    return detokenize(pipeline, pipeline.compat.admit(data, DetokenizeRequest))
