"""POST /v1/responses, and the stored responses: GET and DELETE /v1/responses/{response_id}, POST
/v1/responses/{response_id}/cancel and GET /v1/responses/{response_id}/input_items (choir/app/serving/stored.py,
choir/app/serving/background.py)."""

from collections.abc import AsyncGenerator
from typing import Literal

from litestar import Request, Response
from litestar.params import SkipValidation

from choir.app.errors import error_json
from choir.app.request_ids import now
from choir.app.routes.begin import begin, counted
from choir.app.routes.disconnect import unless_disconnected
from choir.app.routes.replies import event_stream_response, json_response
from choir.app.serving import background
from choir.app.serving.responses import plan_response, respond, stream_response
from choir.app.serving.stored import as_response, continued, not_found, remember, stored, wants_store
from choir.app.serving.streaming import named_frame
from choir.core.errors import bad_request
from choir.core.protocol.responses import DeletedResponse, ResponseItemList, ResponsesRequest
from choir.core.protocol.responses import Response as ResponseObject
from choir.plugins.auth import INTERNAL_OWNER, api_key
from choir.plugins.pipeline import Pipeline, PipelineDependency
from choir.plugins.spec import operation
from choir.plugins.store.store import Store
from choir.plugins.store.tables import page


@operation("createResponse")
async def create_response(data: SkipValidation[ResponsesRequest], request: Request,
                          pipeline: PipelineDependency) -> Response:
    begun = begin(request, pipeline, data, ResponsesRequest, "resp_")
    body = begun.body
    store, owner = store_and_owner(request, pipeline)
    if body.background:
        _check_background(store, body)

    async def answer() -> Response:
        keep = wants_store(store, body)
        if keep and store is not None:  # first: a chain read is never of a response this one would replace
            await store.responses.check_free(begun.response_id)
        context = await continued(store, owner, body)
        job, builder = await plan_response(pipeline, body, begun.response_id, now(), context.history, keep)
        counts = counted(request, job)
        if body.background and store is not None:
            await background.start(store, owner, body, context, pipeline.aggregator, job, builder, counts)
            if body.stream:
                return await _event_stream(background.follow(store, job.response_id), begun.base_id, job.response_id)
            return json_response(builder.response("queued"), begun.base_id)

        async def save(response: ResponseObject) -> None:
            if store is not None and (keep or body.conversation is not None):
                await remember(store, owner, body, response, context)

        if body.stream:
            return await event_stream_response(stream_response(pipeline.aggregator, job, builder, counts, save),
                                               begun.base_id, lambda exc: named_frame(*builder.failed(exc)))
        response = await respond(pipeline.aggregator, job, builder, counts)
        await save(response)
        return json_response(response, begun.base_id)

    if body.background:
        return await answer()  # made apart from this request: a client that leaves does not stop it
    return await unless_disconnected(request.receive, answer())


def _check_background(store: Store | None, body: ResponsesRequest) -> None:
    if store is None:
        raise bad_request("background mode needs the response store, and this server runs without one "
                          "(CHOIR_STORE=off): leave `background` false.", "background")
    if body.store is False:
        raise bad_request("background mode needs `store`: a background response is polled and streamed from the "
                          "store. Leave `store` out, or set it true.", "background")


@operation("getResponse")
async def get_response(response_id: str, request: Request, pipeline: PipelineDependency, stream: bool = False,
                       starting_after: int | None = None) -> Response:
    store, owner = store_and_owner(request, pipeline)
    row = await stored(store, owner, response_id)
    if not stream:
        return Response(as_response(row))
    if not row.background:
        raise bad_request("Only a response made with `background: true` can be streamed again: its events are "
                          "stored. GET it without `stream`.", "stream")
    assert store is not None
    after = -1 if starting_after is None else starting_after
    return await _event_stream(background.follow(store, response_id, after), response_id, response_id)


async def _event_stream(frames: AsyncGenerator[bytes, None], base_id: str, response_id: str) -> Response:
    return await event_stream_response(frames, base_id, lambda exc: named_frame(
        "error", error_json(exc, response_id)))


@operation("cancelResponse")
async def cancel_response(response_id: str, request: Request, pipeline: PipelineDependency) -> ResponseObject:
    """A background response stops where it is (cancelling what has ended returns it as it is)."""
    store, owner = store_and_owner(request, pipeline)
    if store is None:
        raise not_found(response_id, "response_id")
    cancelled, took_effect = await store.responses.cancel(owner, response_id)
    if cancelled is None:
        raise not_found(response_id, "response_id")
    if not cancelled.background:
        raise bad_request("Only a response made with `background: true` can be cancelled.", "response_id")
    if took_effect:  # made here: it stops now (elsewhere: at its next batch of events, or heartbeat)
        store.runs.cancel(response_id)
    return as_response(cancelled)


@operation("deleteResponse")
async def delete_response(response_id: str, request: Request, pipeline: PipelineDependency) -> DeletedResponse:
    store, owner = store_and_owner(request, pipeline)
    if store is None or not await store.responses.delete(owner, response_id):
        raise not_found(response_id, "response_id")
    store.runs.cancel(response_id)  # a background response deleted while it is made here stops
    return DeletedResponse(id=response_id)


@operation("listInputItems")
async def list_input_items(response_id: str, request: Request, pipeline: PipelineDependency,
                           after: str | None = None, limit: int = 20, order: Literal["asc", "desc"] = "desc",
                           before: str | None = None) -> ResponseItemList:
    check_limit(limit)
    store, owner = store_and_owner(request, pipeline)
    row = await stored(store, owner, response_id)
    found = page(list(row.input_items), after, limit, order, before)
    return item_list(found.items, found.has_more)


def check_limit(limit: int) -> None:
    if not 1 <= limit <= 100:
        raise bad_request(f"limit must be from 1 to 100, not {limit}.", "limit")


def item_list(items: list[dict[str, object]], has_more: bool) -> ResponseItemList:
    return ResponseItemList(data=items, first_id=_id(items[0]) if items else None,
                            last_id=_id(items[-1]) if items else None, has_more=has_more)


def _id(item: dict[str, object]) -> str:
    return str(item["id"])


def store_and_owner(request: Request, pipeline: Pipeline) -> tuple[Store | None, str]:
    """The store, and who this request reads and stores as (its API key's digest, or "")."""
    store = pipeline.stored(request)
    if store is None:
        return None, ""
    internal = request.scope.get(INTERNAL_OWNER)  # a batch's line, for its owner
    return store, internal if isinstance(internal, str) else store.owner(api_key(request.scope))

