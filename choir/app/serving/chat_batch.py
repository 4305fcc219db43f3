"""POST /v1/chat/completions/batch (vLLM's): several conversations in one request, one choice each.

Each conversation is planned as a chat request of its own (its own template render, parsers and
engine request `{id}_{i}`), and all run at once; the answers become one response whose choice `i`
answers conversation `i`, with the usage of them all. As in vLLM, `n` must be 1; the batch is never
streamed (vLLM's accepts `stream` and returns a truncated answer; Choir refuses it).
"""

import asyncio

import msgspec

from choir.app.serving.chat import ChatJob, complete_chat, plan_chat
from choir.app.serving.counts import TokenCounts
from choir.core.errors import APIError, bad_request
from choir.core.protocol.chat import BatchChatCompletionRequest, ChatCompletionRequest, ChatCompletionResponse
from choir.core.protocol.common import CompletionTokensDetails, PromptTokensDetails, Usage
from choir.plugins.aggregation import Aggregator
from choir.plugins.pipeline import Pipeline


async def plan_batch(pipeline: Pipeline, batch: BatchChatCompletionRequest, response_id: str,
                     created: int) -> list[ChatJob]:
    if batch.n != 1:
        raise bad_request("Batch chat completions do not support `n > 1`. Please set `n` to 1.", "n")
    if batch.best_of is not None:
        raise bad_request("Batch chat completions do not support `best_of`: send each conversation to "
                          "/v1/chat/completions.", "best_of")
    if batch.stream:
        raise bad_request("Batch chat completions are not streamed: set `stream` to false, or stream each "
                          "conversation from /v1/chat/completions.", "stream")
    fields = msgspec.structs.asdict(batch)
    jobs = []
    for index, conversation in enumerate(batch.messages):
        request = ChatCompletionRequest(**{**fields, "messages": conversation})
        try:
            jobs.append(await plan_chat(pipeline, request, f"{response_id}_{index}", created))
        except APIError as exc:
            raise _in_conversation(exc, index) from None
    return jobs


def _in_conversation(error: APIError, index: int) -> APIError:
    """An error about a conversation's messages names that conversation: `messages[2][0].role`."""
    param = error.param or ""
    if not param.startswith("messages"):
        return error
    located = APIError(error.status, error.message, f"messages[{index}]{param[len('messages'):]}")
    located.headers = error.headers
    return located


async def complete_batch(aggregator: Aggregator, jobs: list[ChatJob], response_id: str,
                         counts: TokenCounts) -> ChatCompletionResponse:
    """Every conversation at once: one failing cancels the others (their engine requests are aborted)."""
    each = [TokenCounts(prompt_tokens=job.prompt_tokens) for job in jobs]
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(complete_chat(aggregator, job, count))
                     for job, count in zip(jobs, each, strict=True)]
    except BaseExceptionGroup as failed:  # the first failure is the answer (a 4xx stays a 4xx)
        raise failed.exceptions[0] from None
    answers = [task.result() for task in tasks]
    counts.completion_tokens = sum(count.completion_tokens or 0 for count in each)
    choices = []
    for index, answer in enumerate(answers):
        [choice] = answer.choices
        choice.index = index
        choices.append(choice)
    first = answers[0]
    return ChatCompletionResponse(id=response_id, created=first.created, model=first.model, choices=choices,
                                  usage=_summed([answer.usage for answer in answers]),
                                  system_fingerprint=first.system_fingerprint)


def _summed(usages: list[Usage]) -> Usage:
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    cached = [u.prompt_tokens_details.cached_tokens for u in usages
              if not isinstance(u.prompt_tokens_details, msgspec.UnsetType)]
    reasoning = [u.completion_tokens_details.reasoning_tokens for u in usages
                 if not isinstance(u.completion_tokens_details, msgspec.UnsetType)]
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(cached)) if cached else msgspec.UNSET,
                 completion_tokens_details=CompletionTokensDetails(reasoning_tokens=sum(reasoning))
                 if reasoning else msgspec.UNSET)
