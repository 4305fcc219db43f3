"""Aggregation: a request's choices (child engine requests) back into one answer.

Non-streaming, `collect` waits for every choice and returns their final outputs in choice order.
Streaming, `merge` yields (choice, delta) pairs as the engine produces them, across all choices,
in batches of what is ready together, with no child buffered whole. Either way the first failure
ends every sibling, and leaving a stream early (the client went away) cancels every choice still
running: cancelling `engine.generate` aborts the request in vLLM.
"""

import asyncio
from collections import deque
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from msgspec import UNSET

from choir.core.errors import stopped_by_server
from choir.core.protocol.common import CompletionTokensDetails, PromptTokensDetails, Usage
from choir.engine.outputs import EngineOutput
from choir.engine.protocol import Engine
from choir.plugins.fanout import Choice

_DONE = object()


def _check_not_aborted(output: EngineOutput) -> EngineOutput:
    if output.finished and any(o.finish_reason == "abort" for o in output.outputs):
        raise stopped_by_server()
    return output


class Aggregator:
    __slots__ = ("engine",)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _generate(self, choice: Choice) -> AsyncGenerator[EngineOutput, None]:
        return self.engine.generate(choice.prompt, choice.params, choice.request_id, choice.options)

    async def collect(self, choices: list[Choice]) -> list[EngineOutput]:
        async def final(choice: Choice) -> EngineOutput:
            last = None
            async for output in self._generate(choice):
                last = output
            if last is None:  # an engine request yields its final output at least
                raise RuntimeError(f"the engine request {choice.request_id} ended without an output")
            return _check_not_aborted(last)

        if len(choices) == 1:  # the common case needs no task group
            return [await final(choices[0])]
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(final(choice)) for choice in choices]
        except BaseExceptionGroup as failed:  # the first failure is the one to report
            raise failed.exceptions[0] from None
        return [task.result() for task in tasks]

    async def merge(self, choices: list[Choice]) -> AsyncGenerator[list[tuple[Choice, EngineOutput]], None]:
        """Batches of (choice, output): what the engine has produced since the last batch, so that
        one engine step's outputs for several choices can go out together."""
        if len(choices) == 1:  # the common case needs no tasks or queue
            choice = choices[0]
            # aclosing: closing this stream must close (and so abort) the engine request now, not at GC.
            async with aclosing(self._generate(choice)) as outputs:
                async for output in outputs:
                    if output.finished:
                        _check_not_aborted(output)
                    yield [(choice, output)]
            return

        # What the choices' pumps have produced and the consumer has not taken, and the future the consumer
        # waits on when there is none: a deque and a future, not an asyncio.Queue, whose put and get cost
        # five Python calls an output where a stream at n = 4 has dozens of outputs.
        ready: deque[tuple[Choice | None, Any]] = deque()
        waiter: asyncio.Future[None] | None = None

        def put(item: tuple[Choice | None, Any]) -> None:
            ready.append(item)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        async def pump(choice: Choice) -> None:
            try:
                async for output in self._generate(choice):
                    if output.finished:
                        _check_not_aborted(output)
                    put((choice, output))
                put((choice, _DONE))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # handed to the consumer, which stops everything
                put((None, exc))

        tasks = [asyncio.create_task(pump(choice)) for choice in choices]
        running = len(tasks)
        loop = asyncio.get_running_loop()
        try:
            while running:
                if not ready:
                    waiter = loop.create_future()
                    await waiter
                    waiter = None
                batch: list[tuple[Choice, EngineOutput]] = []
                while ready:
                    source, output = ready.popleft()
                    if source is None:
                        raise output
                    if output is _DONE:
                        running -= 1
                    else:
                        batch.append((source, output))
                if batch:
                    yield batch
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

def prompt_tokens(choices: list[Choice]) -> int:
    """Each prompt counts once, however many choices sample it."""
    return sum(len(prompt.token_ids) for prompt in {c.prompt_index: c.prompt for c in choices}.values())


def cached_tokens(choices: list[Choice], counts: list[int | None]) -> int | None:
    """Prompt tokens the prefix cache held (each choice's `num_cached_tokens`), each prompt once, like
    its tokens: the fewest any of its choices found, which is what the cache held before this request.
    None: the engine did not say."""
    per_prompt: dict[int, int] = {}
    for choice, cached in zip(choices, counts, strict=True):
        if cached is None:
            return None
        per_prompt[choice.prompt_index] = min(cached, per_prompt.get(choice.prompt_index, cached))
    return sum(per_prompt.values())


def usage(choices: list[Choice], completion_tokens: int, reasoning_tokens: int | None = None,
          cached: int | None = None) -> Usage:
    prompt = prompt_tokens(choices)
    details = UNSET if reasoning_tokens is None else CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
    prompt_details = UNSET if cached is None else PromptTokensDetails(cached_tokens=cached)
    return Usage(prompt_tokens=prompt, completion_tokens=completion_tokens, total_tokens=prompt + completion_tokens,
                 prompt_tokens_details=prompt_details, completion_tokens_details=details)
