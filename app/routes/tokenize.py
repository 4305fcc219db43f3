from litestar import Request
from litestar.params import SkipValidation

from app.serving.tokenize import detokenize, tokenize
from core.protocol import parse_strict
from core.protocol.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from plugins.pipeline import PipelineDependency
from plugins.spec import operation


@operation("tokenize")
async def create_tokens(data: SkipValidation[TokenizeRequest], request: Request,
                        pipeline: PipelineDependency) -> TokenizeResponse:
    pipeline.compat.check_body(data, TokenizeRequest)
    return await tokenize(pipeline, parse_strict(data, TokenizeRequest))


@operation("detokenize")
async def create_text(data: SkipValidation[DetokenizeRequest], request: Request,
                      pipeline: PipelineDependency) -> DetokenizeResponse:
    pipeline.compat.check_body(data, DetokenizeRequest)
    return detokenize(pipeline, parse_strict(data, DetokenizeRequest))
