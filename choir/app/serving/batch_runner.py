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
from collections.abc import AsyncIterator, Callable, Iterator
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
POLL_SECONDS = 1.0  # how often a runner looks for a batch to run, after one ran or was made here
# An idle runner looks half as often each time it finds nothing, down to once in this (a batch made in this process
# wakes it at once; one made in a busy process waits for another's look): an idle server's store is left alone.
IDLE_POLL_SECONDS = 8.0
HEARTBEAT_SECONDS = 5  # how often a runner says it still runs its batch (and learns of a cancel, counts progress)
WINDOW_SECONDS = 24 * 3600  # completion_window "24h"
DRAIN_SECONDS = 20  # at shutdown, how long the lines in flight may take to be answered and stored
RETRY_SECONDS = 2.0  # how soon lines refused for now (RETRIED) are tried again
RETRIED = (429, 503)  # answers that are no line's fault (the engine busy, dead or stopping): not stored, tried again
# Under --scheduling-policy priority a batch's lines wait behind live requests (vLLM runs lower numbers first);
# the endpoints whose requests take a priority.
BATCH_PRIORITY = 1
PRIORITIZED = ("/v1/chat/completions", "/v1/completions")
ASGI = Any  # the app itself (ChoirApp): each line goes through all of it, as a live request does


async def dispatch(app: ASGI, path: str, body: bytes, owner: str,
                   request_id: str | None) -> tuple[int, str, bytes]:
    """One POST through the app in process, for `owner`: its status, its request id and its body. `request_id`:
    sent as X-Request-Id (None: the body's own `request_id`, or one the app makes)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if request_id is not None:
        headers.append((b"x-request-id", request_id.encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 0), "server": ("batch", 0), "state": {}, INTERNAL_OWNER: owner}
    delivered = False
    status, answered_id, chunks = 500, request_id or "", []

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
    """The output file's line (2xx) or the error file's, as OpenAI writes them: an answer's error is in its body,
    the line's own `error` is for a request that got no answer (one past the batch's window)."""
    try:
        decoded: Any = json.loads(body)
    except ValueError:
        decoded = {"error": {"message": body.decode(errors="replace"), "type": "server_error"}}
    line = {"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": request.custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": decoded}, "error": None}
    return 200 <= status < 300, line


class BatchRunner:
    """`stored`: the app's store once its lifespan has started it (None before, and on a server without one)."""

    def __init__(self, app: ASGI, stored: Callable[[], Store | None], concurrency: int,
                 priority_scheduling: Callable[[], bool] = lambda: False,
                 draining: Callable[[], bool] = lambda: False) -> None:
        self.app, self.stored, self.concurrency = app, stored, concurrency
        self.priority_scheduling, self.draining = priority_scheduling, draining
        self.closing = False  # the server stops: no new line, the lines in flight answered and stored
        self.current: Run | None = None  # the batch being run
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

    def cancelled(self, batch_id: str) -> None:
        """A cancel that landed in this process, for the batch this runner runs: no new line from now (another
        process's runner learns of it at its next heartbeat)."""
        if self.current is not None and self.current.batch_id == batch_id:
            self.current.stopping = self.current.stopping or "cancelled"

    async def run_forever(self) -> None:
        wait = POLL_SECONDS
        while not self.closing:
            store = self.stored()
            try:
                row = await store.batches.claim(self.name) if store is not None and not self.draining() else None
            except StoreUnavailable:
                row = None
            except Exception:  # noqa: BLE001 - the runner goes on: the next poll tries again
                log.exception("batch claim failed")
                row = None
            if row is None:
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                    wait = POLL_SECONDS
                except TimeoutError:
                    wait = min(wait * 2, IDLE_POLL_SECONDS)
                self._wake.clear()
                continue
            wait = POLL_SECONDS
            try:
                self.current = Run(self, row.id, row.owner, dict(row.body))
                await self.current.go()
            except StoreUnavailable:
                await asyncio.sleep(POLL_SECONDS)  # claimed again, by this runner or another, once it is back
            except Exception:  # noqa: BLE001 - one batch's fault stops neither the runner nor the server
                log.exception("batch run failed", batch_id=row.id)
                await asyncio.sleep(POLL_SECONDS)
            finally:
                self.current = None


class Run:
    """One batch, from where it stands to its end."""

    def __init__(self, runner: BatchRunner, batch_id: str, owner: str, body: dict[str, Any]) -> None:
        self.runner, self.store, self.batch_id, self.owner, self.body = runner, runner.store, batch_id, owner, body
        # Why no new line is sent: "cancelled", "expired", "failed" (its input file is gone), "lost" (another
        # process holds the batch now), "paused" (the server drains or stops: another process goes on).
        self.stopping: str | None = None
        counts = body.get("request_counts") or {}
        self.done = {"completed": counts.get("completed", 0), "failed": counts.get("failed", 0)}

    async def go(self) -> None:
        watch = asyncio.create_task(self._watch())
        try:
            requests = None
            if self.body["status"] == "validating":
                requests = await self._validate()
                if requests is None:
                    return
            if self.body["status"] == "in_progress":
                await self._answer(requests)
            if self.stopping in ("lost", "paused", "failed"):
                return  # released: claimed again (unless it failed), and gone on from the lines not yet answered
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
        # Off the event loop: a large file would hold up every live request while it is read.
        return await asyncio.to_thread(read_requests, content, self.body["endpoint"])

    async def _validate(self) -> list[BatchRequest] | None:
        requests, errors = await self._requests()
        if errors:
            await self._fail(errors, "validating")
            return None
        self.body.update(status="in_progress", in_progress_at=int(time.time()),
                         request_counts={"total": len(requests), "completed": 0, "failed": 0})
        if not await self.store.batches.change(self.batch_id, self.body, ("validating",)):
            self.body["status"] = "cancelling"  # cancelled while it was checked
            self.stopping = "cancelled"
        return requests

    async def _fail(self, errors: list[BatchError], state: str) -> None:
        """Failed, naming why (at most 1,000 errors, each bad line's), if it is still in `state`."""
        self.body.update(status="failed", failed_at=int(time.time()),
                         errors=msgspec.to_builtins(BatchErrors(data=errors[:1000])))
        await self.store.batches.change(self.batch_id, self.body, (state,))

    async def _answer(self, requests: list[BatchRequest] | None) -> None:
        if requests is None:
            requests, errors = await self._requests()
            if errors:  # the input file went away (deleted) after the batch was checked
                await self._fail(errors, "in_progress")
                self.stopping = "failed"
                return
        while True:
            answered = await self.store.batches.answered(self.batch_id)
            waiting = iter([request for request in requests if request.line not in answered])
            busy = [False]  # whether a line was refused for now (the engine busy or stopping): tried again
            async with asyncio.TaskGroup() as workers:  # one fails: the others are cancelled, none left behind
                for _ in range(self.runner.concurrency):
                    workers.create_task(self._work(waiting, busy))
            if not busy[0] or self.stopping is not None or self._held():
                break
            await asyncio.sleep(RETRY_SECONDS)
        if self.stopping is None and self._expired():
            self.stopping = "expired"
        if self.stopping == "expired":  # what was not answered in the window is an error line each
            answered = await self.store.batches.answered(self.batch_id)
            for request in requests:
                if request.line not in answered:
                    await self.store.batches.answer(self.batch_id, request.line, False, {
                        "id": f"batch_req_{secrets.token_hex(12)}", "custom_id": request.custom_id, "response": None,
                        "error": {"code": "batch_expired", "message": "The batch expired before this request ran."}})

    def _held(self) -> bool:
        """No new line now: the server drains or stops (the batch is handed on)."""
        if self.runner.closing or self.runner.draining():
            self.stopping = self.stopping or "paused"
            return True
        return False

    async def _work(self, waiting: Iterator[BatchRequest], busy: list[bool]) -> None:
        for request in waiting:
            if self.stopping is not None or self._held() or self._expired():
                return
            body = self._prioritized(request.body)
            headers_id = None if "request_id" in body else f"batch_req_{secrets.token_hex(12)}"
            status, request_id, answer = await dispatch(self.runner.app, self.body["endpoint"],
                                                        json.dumps(body).encode(), self.owner, headers_id)
            if status in RETRIED:  # not this line's fault: left unanswered, tried again
                busy[0] = True
                continue
            ok, line = answer_line(request, status, request_id, answer)
            if await self.store.batches.answer(self.batch_id, request.line, ok, line):
                self.done["completed" if ok else "failed"] += 1

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
                if status is None:
                    self.stopping = "lost"  # another process took it (this one was not heard of for too long)
                elif status == "cancelling":
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
        mine = self.runner.name
        body = {**stored.body, "request_counts": self.body.get("request_counts") or stored.body.get("request_counts")}
        if stored.status == "in_progress":
            body.update(status="finalizing", finalizing_at=int(time.time()))
            if not await self.store.batches.change(self.batch_id, body, ("in_progress",), mine):
                stored = await self.store.batches.get(None, self.batch_id)
                if stored is None or stored.status != "cancelling" or stored.runner != mine:
                    return  # no longer this runner's to end
                body = {**stored.body, "request_counts": body["request_counts"]}
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
        await self.store.batches.change(self.batch_id, body, ("finalizing", "cancelling", "in_progress"), mine)


class BatchRunnerPlugin(InitPlugin):
    """Each API process with a store runs batches: its runner starts after the store and stops before it."""

    __slots__ = ("store_key", "engine_key", "drain_key", "concurrency", "state_key")

    def __init__(self, store_key: str, engine_key: str, drain_key: str, concurrency: int, state_key: str) -> None:
        self.store_key, self.engine_key, self.drain_key = store_key, engine_key, drain_key
        self.concurrency, self.state_key = concurrency, state_key

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        app_config.lifespan.append(self.running)
        return app_config

    @contextlib.asynccontextmanager
    async def running(self, app: Litestar) -> AsyncIterator[None]:
        runner = BatchRunner(app, lambda: app.state.get(self.store_key), self.concurrency,
                             lambda: bool(getattr(app.state.get(self.engine_key), "priority_scheduling", False)),
                             lambda: bool(getattr(app.state.get(self.drain_key), "draining", False)))
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
