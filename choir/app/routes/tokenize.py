from litestar import Request
from litestar.params import SkipValidation

from choir.app.serving.tokenize import detokenize, tokenize
from choir.core.protocol.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation


@operation("tokenize")
async def create_tokens(data: SkipValidation[TokenizeRequest], request: Request,
                        pipeline: PipelineDependency) -> TokenizeResponse:
    return await tokenize(pipeline, pipeline.compat.admit(data, TokenizeRequest))


@operation("detokenize")
async def create_text(data: SkipValidation[DetokenizeRequest], request: Request,
                      pipeline: PipelineDependency) -> DetokenizeResponse:
    return detokenize(pipeline, pipeline.compat.admit(data, DetokenizeRequest))
