"""Background responses (`background: true`): stored at once as `queued`, then made by a task of this
process that no client holds: it goes on when the client leaves, and ends `completed`, `incomplete`,
`failed` or `cancelled`. Its events are stored as they come (a batch at most every FLUSH_SECONDS, the last
ones with its final state), so a stream that follows it may start on any API process, from any event.
A store that goes away meanwhile costs the run nothing: its events wait, and its final state is stored once the
store is back (within STORE_PATIENCE_SECONDS; after that, like a run whose process died, it is reaped as failed)."""

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable
from contextlib import aclosing
from typing import Any

import msgspec

from choir.app.serving.chat import ChatJob
from choir.app.serving.counts import TokenCounts
from choir.app.serving.response_events import Event, ResponseBuilder
from choir.app.serving.responses import response_events
from choir.app.serving.stored import Continued
from choir.app.serving.streaming import named_frame
from choir.core.errors import APIError
from choir.core.protocol.responses import ResponsesRequest
from choir.plugins.aggregation import Aggregator
from choir.plugins.store.responses import HEARTBEAT_SECONDS, STALE_SECONDS, UNFINISHED, InTransaction
from choir.plugins.store.runs import Frame, Run
from choir.plugins.store.store import Store
from choir.plugins.store.tables import StoreUnavailable

FLUSH_SECONDS = 0.2  # how often a run stores its new events (and learns whether it was cancelled elsewhere)
POLL_SECONDS = 0.2  # how often a stream on another process looks for them
STORE_PATIENCE_SECONDS = STALE_SECONDS  # how long a run's final state waits for a store that went away
RETRY_SECONDS = 0.5  # how often it tries again meanwhile
REAP_MARGIN_SECONDS = 5  # it stops trying this long before a reader would take the run for dead


async def start(store: Store, owner: str, request: ResponsesRequest, context: Continued, aggregator: Aggregator,
                job: ChatJob, builder: ResponseBuilder, counts: TokenCounts) -> None:
    """The response stored as queued, and its run started."""
    await store.responses.save(owner, msgspec.to_builtins(builder.response("queued")), context.turn, context.chain)
    run = Run()
    store.runs.start(job.response_id, run, _make(store, run, request, context, aggregator, job, builder, counts))


async def _make(store: Store, run: Run, request: ResponsesRequest, context: Continued, aggregator: Aggregator,
                job: ChatJob, builder: ResponseBuilder, counts: TokenCounts) -> None:
    responses, response_id = store.responses, job.response_id
    writer = _Writer(store, run, response_id)
    task = asyncio.current_task()
    assert task is not None
    watch = asyncio.create_task(_watch(store, response_id, task, writer))
    try:
        if not await responses.change(response_id, msgspec.to_builtins(builder.response("in_progress"))):
            return  # cancelled while queued
        async with aclosing(response_events(aggregator, job, builder, counts)) as batches:
            async for events, _ in batches:
                if builder.closed is not None:
                    turn = None
                    if request.conversation_id is not None:  # the turn goes in with the final state, or not at all
                        items = [*context.turn, *msgspec.to_builtins(builder.closed.output)]
                        turn = store.conversations.appending(request.conversation_id, items)
                    await writer.write(events, msgspec.to_builtins(builder.closed), turn)
                    return
                if not await writer.write(events):
                    return  # cancelled: leaving the loop aborts the generation
    except asyncio.CancelledError:
        # Cancelled here: by a cancel (stored already, so nothing more is written) or because the server stops.
        stopped = APIError(503, "The server stopped while this background response was being made.")
        await _quietly(writer.write([builder.failed(stopped)], _failed_body(builder, stopped), patience=0))
        raise
    except StoreUnavailable:
        pass  # gone for STORE_PATIENCE_SECONDS at the end, or at the start: reaped as failed once it is back
    except Exception as exc:  # noqa: BLE001 - told as the response's failure, as a stream tells it
        await _quietly(writer.write([builder.failed(exc)], _failed_body(builder, exc)))
    finally:
        watch.cancel()


async def _watch(store: Store, response_id: str, task: "asyncio.Task[None]", writer: "_Writer") -> None:
    """Every HEARTBEAT_SECONDS without a batch of events: say the run is still at work, and learn of a cancel
    that landed on another process (while the request waits in the engine's queue, say)."""
    while True:
        await asyncio.sleep(HEARTBEAT_SECONDS)
        if time.monotonic() - writer.flushed < HEARTBEAT_SECONDS:
            continue
        try:
            going = await store.responses.heartbeat(response_id)
        except StoreUnavailable:
            continue
        writer.heard = time.monotonic()
        if not going:
            task.cancel()
            return


class _Writer:
    """A run's events: to the streams of this process at once, to the store in batches. A batch the store
    cannot take now waits for the next one; the final one is tried again while the run is not yet taken for
    dead (STALE_SECONDS after the store last heard of it, less a margin), and for `patience` seconds at most."""

    def __init__(self, store: Store, run: Run, response_id: str) -> None:
        self.store, self.run, self.response_id = store, run, response_id
        self.sequence, self.flushed = 0, time.monotonic()
        self.heard = time.monotonic()  # when the store last took a write of this run's (events, or a heartbeat)
        self.pending: list[Frame] = []

    async def write(self, events: list[Event], final: dict[str, Any] | None = None,
                    then: InTransaction | None = None, patience: float = STORE_PATIENCE_SECONDS) -> bool:
        frames = [(self.sequence + index, name, data) for index, (name, data) in enumerate(events)]
        self.sequence += len(frames)
        self.pending += frames
        if final is None and time.monotonic() - self.flushed < FLUSH_SECONDS:
            self.run.add(frames)
            return True
        self.flushed = time.monotonic()
        if final is None:
            try:
                going = await self._flush(final, then)
            except StoreUnavailable:
                going = True  # the batch waits for the next one; this process's streams have it now
            if going:
                self.run.add(frames)
            return going
        deadline = min(time.monotonic() + patience, self.heard + STALE_SECONDS - REAP_MARGIN_SECONDS)
        try:
            while True:
                try:
                    going = await self._flush(final, then)
                    break
                except StoreUnavailable:
                    if time.monotonic() >= deadline:
                        raise
                    await asyncio.sleep(RETRY_SECONDS)
        except BaseException:
            # Not stored: these last events are not the run's (a failure's may follow them), the earlier ones are.
            del self.pending[len(self.pending) - len(frames):]
            self.sequence -= len(frames)
            raise
        if going:  # the last events after their state is stored: a client that reads them may GET it
            self.run.add(frames)
        return going

    async def _flush(self, final: dict[str, Any] | None, then: InTransaction | None) -> bool:
        going = await self.store.responses.add_events(
            self.response_id, [(sequence, name, data.decode()) for sequence, name, data in self.pending], final,
            then)
        self.pending, self.heard = [], time.monotonic()
        return going


def _failed_body(builder: ResponseBuilder, error: Exception) -> dict[str, Any]:
    return msgspec.to_builtins(builder.failed_response(error))


async def _quietly(write: Awaitable[bool]) -> None:
    try:
        await write
    except StoreUnavailable:
        pass  # logged by the store; the response stays as it was last stored


async def follow(store: Store, response_id: str, after: int = -1) -> AsyncGenerator[bytes, None]:
    """A background response's stream from the event after `after`: from its run when it is made in this
    process, else from the store, until it ends."""
    run = store.runs.runs.get(response_id)
    if run is not None:
        async for frames in run.follow(after):
            yield b"".join(named_frame(name, data) for _, name, data in frames)
        return
    while True:
        status, events = await store.responses.events(response_id, after)
        if events:
            after = events[-1][0]
            yield b"".join(named_frame(name, data.encode()) for _, name, data in events)
        if status not in UNFINISHED:
            return
        if not events:
            await asyncio.sleep(POLL_SECONDS)
