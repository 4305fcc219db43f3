"""Background responses being made in this process: each one's events so far, for the streams that follow
it here (another process follows it through the stored events), and its task, stopped at shutdown."""

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

Frame = tuple[int, str, bytes]  # an event's sequence number, type and JSON


class Run:
    def __init__(self) -> None:
        self.events: list[Frame] = []
        self.done = False
        self._changed = asyncio.Event()

    def add(self, events: list[Frame]) -> None:
        self.events += events
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self) -> None:
        self.done = True
        self._changed.set()

    async def follow(self, after: int = -1) -> AsyncIterator[list[Frame]]:
        """The events after sequence number `after` as they come, until the run ends."""
        seen = 0
        while True:
            changed = self._changed
            fresh = [event for event in self.events[seen:] if event[0] > after]
            seen = len(self.events)
            if fresh:
                yield fresh
            if self.done:
                return
            await changed.wait()


class Runs:
    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, response_id: str, run: Run, work: Coroutine[Any, Any, None]) -> None:
        self.runs[response_id] = run
        task = asyncio.get_running_loop().create_task(work, name=f"background {response_id}")
        self._tasks[response_id] = task

        def forget(_: asyncio.Task[None]) -> None:
            run.end()
            self.runs.pop(response_id, None)
            self._tasks.pop(response_id, None)

        task.add_done_callback(forget)

    def cancel(self, response_id: str) -> None:
        if (task := self._tasks.get(response_id)) is not None:
            task.cancel()

    async def stop(self) -> None:
        """At shutdown: every run cancelled (each says so in the store), and waited for."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
