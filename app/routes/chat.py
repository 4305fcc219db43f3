from litestar import Request, Response

from app.protocol.chat import ChatCompletionRequest
from app.routes.request_ids import now, request_base_id
from app.routes.responses import json_response, sse_response
from app.serving.chat import complete_chat, plan_chat, stream_chat
from plugins.engine.protocol import EngineDependency
from plugins.spec import operation


@operation("createChatCompletion")
async def create_chat_completion(data: ChatCompletionRequest, engine: EngineDependency,
                                 request: Request) -> Response:
    base_id = request_base_id(request)
    request.state.response_id = response_id = f"chatcmpl-{base_id}"
    job = await plan_chat(engine, data, response_id, now())
    request.state.prompt_tokens = sum(len(choice.prompt.token_ids) for choice in job.choices)
    if data.stream:
        return sse_response(await stream_chat(engine, job), base_id)
    response = await complete_chat(engine, job)
    request.state.completion_tokens = response.usage.completion_tokens
    return json_response(response, base_id)
