"""POST /v1/responses, and the stored responses: GET and DELETE /v1/responses/{response_id}, and GET
/v1/responses/{response_id}/input_items (app/serving/stored.py)."""

from typing import Literal

from litestar import Request, Response
from litestar.params import SkipValidation

from app.request_ids import now
from app.routes.begin import begin, counted
from app.routes.disconnect import unless_disconnected
from app.routes.replies import event_stream_response, json_response
from app.serving.responses import plan_response, respond, stream_response
from app.serving.stored import as_response, continued, remember, stored, wants_store
from app.serving.streaming import named_frame
from core.errors import bad_request
from core.protocol.responses import DeletedResponse, ResponseItemList, ResponsesRequest
from core.protocol.responses import Response as ResponseObject
from plugins.auth import authorization
from plugins.pipeline import Pipeline, PipelineDependency
from plugins.spec import operation
from plugins.store.responses import ResponseStore, page


@operation("createResponse")
async def create_response(data: SkipValidation[ResponsesRequest], request: Request,
                          pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, ResponsesRequest, "resp_")
    body = begun.body
    store, owner = _store_and_owner(request, pipeline)

    async def answer() -> Response:
        history = None
        if store is not None:
            history = await continued(store, owner, body.previous_response_id) if body.previous_response_id else []
        keep = wants_store(store, body)
        if keep and store is not None:
            await store.check_free(begun.response_id)
        job, builder = await plan_response(pipeline, body, begun.response_id, now(), history, keep)
        counts = counted(request, job)

        async def save(response: ResponseObject) -> None:
            if keep and store is not None:
                await remember(store, owner, body, response, history)

        if body.stream:
            return await event_stream_response(stream_response(pipeline.aggregator, job, builder, counts, save),
                                               begun.base_id, lambda exc: named_frame(*builder.failed(exc)))
        response = await respond(pipeline.aggregator, job, builder, counts)
        await save(response)
        return json_response(response, begun.base_id)

    return await unless_disconnected(request.receive, answer())


@operation("getResponse")
async def get_response(response_id: str, request: Request, pipeline: PipelineDependency,
                       stream: bool = False) -> ResponseObject:
    if stream:
        raise bad_request("Replaying a stored response as a stream is not served yet: leave `stream` out.", "stream")
    store, owner = _store_and_owner(request, pipeline)
    return as_response(await stored(store, owner, response_id))


@operation("deleteResponse")
async def delete_response(response_id: str, request: Request, pipeline: PipelineDependency) -> DeletedResponse:
    store, owner = _store_and_owner(request, pipeline)
    await stored(store, owner, response_id)  # a 404 unless it is this key's
    assert store is not None
    await store.delete(owner, response_id)
    return DeletedResponse(id=response_id)


@operation("listInputItems")
async def list_input_items(response_id: str, request: Request, pipeline: PipelineDependency,
                           after: str | None = None, limit: int = 20,
                           order: Literal["asc", "desc"] = "desc") -> ResponseItemList:
    if not 1 <= limit <= 100:
        raise bad_request(f"limit must be from 1 to 100, not {limit}.", "limit")
    store, owner = _store_and_owner(request, pipeline)
    row = await stored(store, owner, response_id)
    found = page(list(row.input_items), after, limit, order)
    return ResponseItemList(data=found.items, first_id=found.items[0]["id"] if found.items else None,
                            last_id=found.items[-1]["id"] if found.items else None, has_more=found.has_more)


def _store_and_owner(request: Request, pipeline: Pipeline) -> tuple[ResponseStore | None, str]:
    """The response store, and who this request reads and stores as (its API key's digest, or "")."""
    store = pipeline.stored_responses(request)
    return store, store.owner(authorization(request.scope)) if store is not None else ""
