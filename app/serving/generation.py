"""Run a request's choices on the engine: all to completion, or merged as they stream.

A request becomes a list of `Choice`s (one per prompt and sample), each an engine request.
Streaming merges the choices' outputs in arrival order; leaving the stream early (client gone,
an error) cancels every choice still running, and cancelling `engine.generate` aborts it in vLLM.
"""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from plugins.engine.protocol import Engine, Prompt

_DONE = object()


@dataclass(frozen=True, slots=True)
class Choice:
    index: int  # the choice's index in the response
    prompt_index: int
    prompt: Prompt
    params: Any  # vllm.SamplingParams
    request_id: str  # the engine request id


async def collect(engine: Engine, choices: list[Choice]) -> list[Any]:
    """The final output of every choice, in choice order; the first failure cancels the rest."""

    async def final(choice: Choice) -> Any:
        last = None
        async for output in engine.generate(choice.prompt, choice.params, choice.request_id):
            last = output
        return last

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(final(choice)) for choice in choices]
    except BaseExceptionGroup as failed:  # the first failure is the one to report
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


async def merge(engine: Engine, choices: list[Choice]) -> AsyncIterator[tuple[Choice, Any]]:
    """(choice, delta output) pairs as the engine produces them, across all choices."""
    if len(choices) == 1:  # the common case needs no tasks or queue
        choice = choices[0]
        async for output in engine.generate(choice.prompt, choice.params, choice.request_id):
            yield choice, output
        return

    queue: asyncio.Queue[tuple[Choice | None, Any]] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for output in engine.generate(choice.prompt, choice.params, choice.request_id):
                queue.put_nowait((choice, output))
            queue.put_nowait((choice, _DONE))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, which stops everything
            queue.put_nowait((None, exc))

    tasks = [asyncio.create_task(pump(choice)) for choice in choices]
    running = len(tasks)
    try:
        while running:
            choice, item = await queue.get()
            if choice is None:
                raise item
            if item is _DONE:
                running -= 1
            else:
                yield choice, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
