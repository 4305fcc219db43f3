"""Batches run by this process: it claims one in the store (one process runs a batch when there are N), checks its
input file, answers its lines a bounded number at a time, then writes the output and error files. Each line is
sent through this app, in process, to the live endpoint it names, for the batch's owner: it is answered exactly
as the same request sent live (fan-out, parsers, structured outputs, LoRA names, pooling roles). Each answered
line is stored as it comes: a batch whose process stopped is claimed again and goes on from the lines not yet
answered. A cancel (from any process) stops new lines; past its 24-hour window a batch expires."""

import asyncio
import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import structlog
from litestar import Litestar
from litestar.config.app import AppConfig
from litestar.plugins import InitPlugin

from choir.app.serving.batch_input import BatchRequest, read_requests
from choir.core.protocol.batches import BatchError, BatchErrors
from choir.plugins.auth import INTERNAL_OWNER
from choir.plugins.store.batches import RUNNING
from choir.plugins.store.store import Store
from choir.plugins.store.tables import StoreUnavailable

log = structlog.get_logger("choir.batch")
POLL_SECONDS = 1.0  # how often an idle runner looks for a batch to run
HEARTBEAT_SECONDS = 5  # how often a runner says it still runs its batch (and learns of a cancel, counts progress)
WINDOW_SECONDS = 24 * 3600  # completion_window "24h"
DRAIN_SECONDS = 60  # at shutdown, how long the lines in flight may take to be answered and stored
# Under --scheduling-policy priority a batch's lines wait behind live requests (vLLM runs lower numbers first);
# the endpoints whose requests take a priority.
BATCH_PRIORITY = 1
PRIORITIZED = ("/v1/chat/completions", "/v1/completions")
ASGI = Any  # the app itself (ChoirApp): each line goes through all of it, as a live request does


async def dispatch(app: ASGI, path: str, body: bytes, owner: str, request_id: str) -> tuple[int, str, bytes]:
    """One POST through the app in process, for `owner`: its status, its request id and its body."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"x-request-id", request_id.encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 0), "server": ("batch", 0), "state": {}, INTERNAL_OWNER: owner}
    delivered = False
    status, answered_id, chunks = 500, request_id, []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Future()  # nobody leaves: a watcher for a disconnect waits for ever
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, answered_id
        if message["type"] == "http.response.start":
            status = message["status"]
            for name, value in message.get("headers", ()):
                if name == b"x-request-id":
                    answered_id = value.decode()
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, answered_id, b"".join(chunks)


def answer_line(request: BatchRequest, status: int, request_id: str, body: bytes) -> tuple[bool, dict[str, Any]]:
    """The output file's line (2xx) or the error file's, as OpenAI writes them."""
    try:
        decoded: Any = json.loads(body)
    except ValueError:
        decoded = {"error": {"message": body.decode(errors="replace"), "type": "server_error"}}
    line = {"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": request.custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": decoded}, "error": None}
    if 200 <= status < 300:
        return True, line
    error = decoded.get("error") if isinstance(decoded, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    line["error"] = {"code": str(error.get("type") if isinstance(error, dict) else status), "message": message}
    return False, line


class BatchRunner:
    """`stored`: the app's store once its lifespan has started it (None before, and on a server without one)."""

    def __init__(self, app: ASGI, stored: Callable[[], Store | None], concurrency: int,
                 priority_scheduling: Callable[[], bool] = lambda: False) -> None:
        self.app, self.stored, self.concurrency = app, stored, concurrency
        self.priority_scheduling = priority_scheduling
        self.closing = False  # the server stops: no new line, the lines in flight answered and stored
        self.name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._wake = asyncio.Event()

    @property
    def store(self) -> Store:
        store = self.stored()
        assert store is not None
        return store

    def wake(self) -> None:
        """A batch was just made here: look now, not at the next poll."""
        self._wake.set()

    async def run_forever(self) -> None:
        while not self.closing:
            store = self.stored()
            try:
                row = await store.batches.claim(self.name) if store is not None else None
            except StoreUnavailable:
                row = None
            if row is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)
                self._wake.clear()
                continue
            try:
                await Run(self, row.id, row.owner, dict(row.body)).go()
            except StoreUnavailable:
                await asyncio.sleep(POLL_SECONDS)  # claimed again, by this runner or another, once it is back
            except Exception:  # noqa: BLE001 - one batch's fault stops neither the runner nor the server
                log.exception("batch run failed", batch_id=row.id)
                await asyncio.sleep(POLL_SECONDS)


class Run:
    """One batch, from where it stands to its end."""

    def __init__(self, runner: BatchRunner, batch_id: str, owner: str, body: dict[str, Any]) -> None:
        self.runner, self.store, self.batch_id, self.owner, self.body = runner, runner.store, batch_id, owner, body
        self.stopping: str | None = None  # "cancelled" or "expired": no new lines
        self.done = {"completed": 0, "failed": 0}

    async def go(self) -> None:
        watch = asyncio.create_task(self._watch())
        try:
            if self.body["status"] == "validating":
                requests = await self._validate()
                if requests is None:
                    return
            if self.body["status"] == "in_progress":
                await self._answer()
            if self.runner.closing:
                return  # released: claimed again, by the next process, from the lines not yet answered
            await self._finish()
        finally:
            watch.cancel()
            with contextlib.suppress(StoreUnavailable):
                await self.store.batches.release(self.batch_id, self.runner.name)

    async def _requests(self) -> tuple[list[BatchRequest], list[BatchError]]:
        content = await self.store.files.content(self.owner, self.body["input_file_id"])
        if content is None:
            return [], [BatchError(code="invalid_file", message=f"The input file '{self.body['input_file_id']}' is "
                                                                 "gone (deleted, or expired).", param="input_file_id")]
        return read_requests(content, self.body["endpoint"])

    async def _validate(self) -> list[BatchRequest] | None:
        requests, errors = await self._requests()
        now = int(time.time())
        if errors:
            self.body.update(status="failed", failed_at=now,
                             errors=msgspec.to_builtins(BatchErrors(data=errors[:1000])))
            await self.store.batches.change(self.batch_id, self.body, ("validating",))
            return None
        self.body.update(status="in_progress", in_progress_at=now,
                         request_counts={"total": len(requests), "completed": 0, "failed": 0})
        if not await self.store.batches.change(self.batch_id, self.body, ("validating",)):
            self.body["status"] = "cancelling"  # cancelled while it was checked
            self.stopping = "cancelled"
        return requests

    async def _answer(self) -> None:
        requests, _ = await self._requests()
        answered = await self.store.batches.answered(self.batch_id)
        for ok, _line in await self.store.batches.answers(self.batch_id):
            self.done["completed" if ok else "failed"] += 1
        waiting = [request for request in requests if request.line not in answered]
        gate = asyncio.Semaphore(self.runner.concurrency)

        async def one(request: BatchRequest) -> None:
            async with gate:
                if self.stopping is not None or self.runner.closing or self._expired():
                    return
                status, request_id, body = await dispatch(
                    self.runner.app, self.body["endpoint"], json.dumps(self._prioritized(request.body)).encode(),
                    self.owner, f"batch_req_{secrets.token_hex(12)}")
                ok, line = answer_line(request, status, request_id, body)
                await self.store.batches.answer(self.batch_id, request.line, ok, line)
                self.done["completed" if ok else "failed"] += 1

        await asyncio.gather(*(one(request) for request in waiting))
        if self.stopping is None and self._expired():
            self.stopping = "expired"
        if self.stopping == "expired":  # what was not answered in the window is an error line each
            answered = await self.store.batches.answered(self.batch_id)
            for request in requests:
                if request.line not in answered:
                    await self.store.batches.answer(self.batch_id, request.line, False, {
                        "id": f"batch_req_{secrets.token_hex(12)}", "custom_id": request.custom_id, "response": None,
                        "error": {"code": "batch_expired", "message": "The batch expired before this request ran."}})

    def _prioritized(self, body: dict[str, Any]) -> dict[str, Any]:
        """Behind live requests, where the engine schedules by priority and the line sets none of its own."""
        if self.body["endpoint"] in PRIORITIZED and "priority" not in body and self.runner.priority_scheduling():
            return {**body, "priority": BATCH_PRIORITY}
        return body

    def _expired(self) -> bool:
        return time.time() > (self.body.get("expires_at") or float("inf"))

    async def _watch(self) -> None:
        """Every HEARTBEAT_SECONDS: the claim kept, the progress stored, a cancel from any process learnt."""
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                status = await self.store.batches.heartbeat(self.batch_id, self.runner.name)
                if status == "cancelling":
                    self.stopping = "cancelled"
                elif status == "in_progress":
                    counts = {**self.body.get("request_counts", {}), **self.done}
                    self.body["request_counts"] = counts
                    await self.store.batches.change(self.batch_id, self.body, ("in_progress",))
            except StoreUnavailable:
                continue

    async def _finish(self) -> None:
        """The output and error files, then the batch's last state (cancelled, expired or completed)."""
        stored = await self.store.batches.get(None, self.batch_id)
        if stored is None or stored.status not in RUNNING:
            return
        body = {**stored.body, "request_counts": self.body.get("request_counts") or stored.body.get("request_counts")}
        if stored.status == "in_progress":
            body.update(status="finalizing", finalizing_at=int(time.time()))
            if not await self.store.batches.change(self.batch_id, body, ("in_progress",)):
                self.stopping = "cancelled"  # a cancel landed just now
        if stored.status == "cancelling":
            self.stopping = "cancelled"
        answers = await self.store.batches.answers(self.batch_id)
        outputs = [line for ok, line in answers if ok]
        errors = [line for ok, line in answers if not ok]
        for name, lines in (("output", outputs), ("error", errors)):
            if lines:
                content = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
                made = await self.store.files.create(self.owner, f"{self.batch_id}_{name}.jsonl", "batch_output",
                                                     content)
                body[f"{name}_file_id"] = made.id
        total = (body.get("request_counts") or {}).get("total", len(answers))
        ending = self.stopping or "completed"
        body.update(status=ending, request_counts={"total": total, "completed": len(outputs), "failed": len(errors)})
        body[f"{ending}_at"] = int(time.time())
        await self.store.batches.change(self.batch_id, body, ("finalizing", "cancelling", "in_progress"))


class BatchRunnerPlugin(InitPlugin):
    """Each API process with a store runs batches: its runner starts after the store and stops before it."""

    __slots__ = ("store_key", "engine_key", "concurrency", "state_key")

    def __init__(self, store_key: str, engine_key: str, concurrency: int, state_key: str) -> None:
        self.store_key, self.engine_key = store_key, engine_key
        self.concurrency, self.state_key = concurrency, state_key

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        app_config.lifespan.append(self.running)
        return app_config

    @contextlib.asynccontextmanager
    async def running(self, app: Litestar) -> AsyncIterator[None]:
        runner = BatchRunner(app, lambda: app.state.get(self.store_key), self.concurrency,
                             lambda: bool(getattr(app.state.get(self.engine_key), "priority_scheduling", False)))
        app.state[self.state_key] = runner
        task = asyncio.create_task(runner.run_forever(), name="batch runner")
        try:
            yield
        finally:
            runner.closing = True
            runner.wake()
            try:
                await asyncio.wait_for(asyncio.shield(task), DRAIN_SECONDS)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            app.state.pop(self.state_key, None)
