"""What every pooling endpoint shares (/v1/embeddings, /rerank, /score, /classify): a prompt must fit the
model's context, and the prompts of one request run as concurrent engine requests, in order."""

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from choir.app.serving.unserved import refuse_unserved
from choir.core.errors import bad_request
from choir.engine.protocol import Prompt, Tokenizing

T = TypeVar("T")
POOLING_UNSERVED = {
    "priority": (0, "pooling requests are not scheduled by priority on this server"),
    "truncate_prompt_tokens": (None, "a query and document pair is not truncated on this server: send "
                                     "max_tokens_per_doc to cut each document"),
    "max_tokens_per_query": (0, "the query is not truncated on this server"),
}


def refuse_pooling_unserved(request: object) -> None:
    refuse_unserved(request, POOLING_UNSERVED)


def check_fits(engine: Tokenizing, prompt: Prompt, where: str, hint: str = "Shorten it.") -> None:
    if not prompt.token_ids:
        raise bad_request(f"{where} has no tokens.", where)
    if len(prompt.token_ids) > engine.max_model_len:
        raise bad_request(f"This model's maximum context length is {engine.max_model_len} tokens, but {where} "
                          f"has {len(prompt.token_ids)} tokens. {hint}", where)


async def run_all(prompts: Sequence[Prompt], response_id: str,
                  run: Callable[[Prompt, str], Coroutine[Any, Any, T]]) -> list[T]:
    """One engine request per prompt (`{response_id}-{i}`, or the response id for one), concurrently; the
    first failure is the one reported, and the others are cancelled (aborted in the engine)."""
    if len(prompts) == 1:
        return [await run(prompts[0], response_id)]
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run(prompt, f"{response_id}-{i}")) for i, prompt in enumerate(prompts)]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


def usage_tokens(prompts: Sequence[Prompt]) -> int:
    return sum(len(prompt.token_ids) for prompt in prompts)
