"""The Batch API (/v1/batches): a batch made from an uploaded file of requests, read back, listed and cancelled; it
is run apart from any client (choir/app/serving/batch_runner.py). A batch another API key made is not there."""

import time
from typing import Any

import msgspec
from litestar import Request
from litestar.params import SkipValidation

from choir.app.routes.files import files_of
from choir.app.serving.batch_runner import WINDOW_SECONDS, BatchRunner
from choir.core.errors import APIError, bad_request
from choir.core.protocol.batches import Batch, BatchCreateRequest, BatchList
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation
from choir.plugins.store.batches import new_batch_id
from choir.plugins.store.models import StoredBatch
from choir.plugins.store.store import Store

RUNNER_STATE_KEY = "batch_runner"
CANCELLABLE = ("validating", "in_progress")


def as_batch(body: dict[str, Any]) -> Batch:
    return msgspec.convert(body, Batch)


def batch_not_found(batch_id: str) -> APIError:
    return APIError(404, f"No batch with id '{batch_id}' is stored for this API key.", "batch_id")


@operation("createBatch")
async def create_batch(data: SkipValidation[BatchCreateRequest], request: Request,
                       pipeline: PipelineDependency) -> Batch:
    body = pipeline.compat.admit(data, BatchCreateRequest)
    store, owner = files_of(request, pipeline)
    described = await store.files.get(owner, body.input_file_id)
    if described is None:
        raise APIError(404, f"No file with id '{body.input_file_id}' is stored for this API key.", "input_file_id")
    if described.purpose != "batch":
        raise bad_request(f"The file '{body.input_file_id}' has purpose '{described.purpose}': a batch's input file "
                          "is uploaded with purpose `batch`.", "input_file_id")
    now = int(time.time())
    batch = Batch(id=new_batch_id(), endpoint=body.endpoint, input_file_id=body.input_file_id,
                  completion_window=body.completion_window, status="validating", created_at=now,
                  expires_at=now + WINDOW_SECONDS, metadata=body.metadata)
    await store.files.keep_until(body.input_file_id, now + WINDOW_SECONDS + 3600)  # read until the batch ends
    await store.batches.create(owner, msgspec.to_builtins(batch))
    if (runner := _runner(request)) is not None:
        runner.wake()
    return batch


async def _owned(request: Request, pipeline: PipelineDependency, batch_id: str) -> tuple[Store, StoredBatch]:
    """The store and the batch, this API key's (a 404 otherwise)."""
    store, owner = files_of(request, pipeline)
    row = await store.batches.get(owner, batch_id)
    if row is None:
        raise batch_not_found(batch_id)
    return store, row


def _runner(request: Request) -> BatchRunner | None:
    return request.app.state.get(RUNNER_STATE_KEY)


@operation("retrieveBatch")
async def retrieve_batch(batch_id: str, request: Request, pipeline: PipelineDependency) -> Batch:
    _, row = await _owned(request, pipeline, batch_id)
    return as_batch(row.body)


@operation("cancelBatch")
async def cancel_batch(batch_id: str, request: Request, pipeline: PipelineDependency) -> Batch:
    """`cancelling` at once; the process running it stops sending its lines and ends it `cancelled`."""
    store, row = await _owned(request, pipeline, batch_id)
    if row.status in ("cancelling", "cancelled"):
        return as_batch(row.body)
    if row.status not in CANCELLABLE:
        raise APIError(409, f"The batch is {row.status}: only a batch still validating or in progress can be "
                            "cancelled.", "batch_id")
    body = {**row.body, "status": "cancelling", "cancelling_at": int(time.time())}
    if not await store.batches.change(batch_id, body, CANCELLABLE):
        _, row = await _owned(request, pipeline, batch_id)  # it ended meanwhile: as it ended
        return as_batch(row.body)
    if (runner := _runner(request)) is not None:
        runner.cancelled(batch_id)
    return as_batch(body)


@operation("listBatches")
async def list_batches(request: Request, pipeline: PipelineDependency, after: str | None = None,
                       limit: int = 20) -> BatchList:
    if not 1 <= limit <= 100:
        raise bad_request("`limit` must be from 1 to 100.", "limit")
    store, owner = files_of(request, pipeline)
    rows, has_more = await store.batches.page(owner, after, limit)
    data = [as_batch(row.body) for row in rows]
    return BatchList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                     has_more=has_more)


BATCH_HANDLERS = [create_batch, retrieve_batch, cancel_batch, list_batches]
