from litestar import Request, Response

from app.protocol.completions import CompletionRequest
from app.routes.request_ids import now, request_base_id
from app.routes.responses import json_response, sse_response
from app.serving.completions import complete, plan_completion, stream_completion
from plugins.engine.protocol import EngineDependency
from plugins.spec import operation


@operation("createCompletion")
async def create_completion(data: CompletionRequest, engine: EngineDependency, request: Request) -> Response:
    base_id = request_base_id(request)
    request.state.response_id = response_id = f"cmpl-{base_id}"
    job = await plan_completion(engine, data, response_id, now())
    request.state.prompt_tokens = sum(len(choice.prompt.token_ids) for choice in job.choices)
    if data.stream:
        return sse_response(await stream_completion(engine, job), base_id)
    response = await complete(engine, job)
    request.state.completion_tokens = response.usage.completion_tokens
    return json_response(response, base_id)
