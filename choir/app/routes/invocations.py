"""POST /invocations: SageMaker's one entry point (as vLLM serves it). The body's shape names the
endpoint: `messages` is a chat completion, `prompt` a completion, `input` an embedding; the answer is
that endpoint's, streamed or not. Behind the API key, like /v1 (vLLM leaves it open)."""

from typing import Any

from litestar import Request, Response
from litestar.params import SkipValidation

from choir.app.routes.chat import create_chat_completion
from choir.app.routes.completions import create_completion
from choir.app.routes.embeddings import create_embedding
from choir.core.errors import bad_request
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation

ROUTES = {"messages": create_chat_completion, "prompt": create_completion, "input": create_embedding}


@operation("invocations")
async def invocations(data: SkipValidation[Any], request: Request, pipeline: PipelineDependency) -> Response:
    if isinstance(data, dict):
        for key, handler in ROUTES.items():
            if key in data:
                return await handler(data=data, request=request, pipeline=pipeline)
    raise bad_request("Cannot find a suitable endpoint for the request: send `messages` (a chat completion), "
                      "`prompt` (a completion) or `input` (an embedding).")
