"""POST /v1/chat/completions: messages → the chat template → choices on the engine → a response or SSE."""

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET

from app.compat import OperationCompat
from app.errors import bad_request
from app.protocol.chat import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    Delta,
    ImagePart,
)
from app.serving.chat_output import ChoiceOutput, MessageParts
from app.serving.jobs import Job
from app.serving.logprobs import chat_logprobs
from app.serving.parsers import ParserSet
from app.serving.prompts import check_common
from app.serving.sampling import build_sampling_params, check_prompt_fits, resolve_max_tokens
from app.serving.streaming import ChunkFrames, Outbox, StreamPlan
from app.serving.structured import structured_outputs
from app.serving.tools import ToolPlan, plan_tools
from plugins.aggregation import Aggregator, usage
from plugins.engine.protocol import ChatTemplateOptions, Engine
from plugins.fanout import Choice, FanOut, PromptRequest


@dataclass(frozen=True, kw_only=True)
class ChatJob(Job):
    request: ChatCompletionRequest
    delta_always: dict[str, Any]  # keys every delta carries (compat profile)
    reasoning_field: str  # where reasoning text goes (compat profile)
    tools: ToolPlan
    parsers: ParserSet | None = None
    parser_request: Any = None  # the request as vLLM's parsers expect it

    def output(self) -> ChoiceOutput:
        return ChoiceOutput(self.tools, self.parsers, self.parser_request)

    def delta(self, parts: MessageParts | None = None, **fields: Any) -> Delta:
        if parts is not None:
            if parts.content:
                fields["content"] = parts.content
            if parts.reasoning:
                fields[self.reasoning_field] = parts.reasoning
            if parts.tool_calls:
                fields["tool_calls"] = parts.tool_calls
        return Delta(**{**self.delta_always, **fields})


def _check_unsupported(request: ChatCompletionRequest) -> None:
    for i, message in enumerate(request.messages):
        for j, part in enumerate(message.content if isinstance(message.content, list) else []):
            if isinstance(part, ImagePart):
                raise bad_request("Image content is not supported: the served model reads text only.",
                                  f"messages[{i}].content[{j}]")
    if request.top_logprobs and not request.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true.", "top_logprobs")


def _messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    return _without_none(msgspec.to_builtins(request.messages))


async def plan_chat(engine: Engine, fan_out: FanOut, compat: OperationCompat, request: ChatCompletionRequest,
                    response_id: str, created: int) -> ChatJob:
    model = check_common(engine, compat, request)
    fan_out.check(request.n, request.seed)
    _check_unsupported(request)
    tools = plan_tools(request, engine.tool_parser)
    template_kwargs = dict(request.chat_template_kwargs or {})
    if tools.template_tools:
        template_kwargs.setdefault("tools", tools.template_tools)
    options = ChatTemplateOptions(add_generation_prompt=request.add_generation_prompt,
                                  continue_final_message=request.continue_final_message, kwargs=template_kwargs)
    try:
        prompt = await engine.render_chat(_messages(request), options)
    except (ValueError, TypeError) as exc:
        message = f"The messages cannot be rendered with the model's chat template: {exc}"
        raise bad_request(message, "messages") from None
    check_prompt_fits(len(prompt.token_ids), engine.max_model_len, "messages")
    if request.max_completion_tokens is not None:
        requested, param = request.max_completion_tokens, "max_completion_tokens"
    else:
        requested, param = request.max_tokens, "max_tokens"
    if requested == 0:
        raise bad_request(f"{param} must be at least 1.", param)
    max_tokens = resolve_max_tokens(requested, len(prompt.token_ids), engine.max_model_len, param)
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    params = build_sampling_params(request, max_tokens=max_tokens, logprobs=logprobs,
                                   defaults=engine.default_sampling_params,
                                   structured_outputs=structured_outputs(request, tools))
    single = PromptRequest(prompt_index=0, prompt=prompt, params=params, request_id=response_id)
    fingerprint = compat.system_fingerprint(engine.version, engine.model_root, engine.max_model_len)
    parsers = engine.parsers
    return ChatJob(request=request, model=model, response_id=response_id, created=created,
                   choices=fan_out.choices([single], request.n), system_fingerprint=fingerprint,
                   delta_always=compat.delta_always, reasoning_field=compat.reasoning_field, tools=tools,
                   parsers=parsers, parser_request=_parser_request(request, model) if parsers else None)


def _parser_request(request: ChatCompletionRequest, model: str) -> Any:
    """The request as vLLM's own protocol type, which its parsers take."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChatRequest

    return VllmChatRequest.model_validate({**_without_none(msgspec.to_builtins(request)), "model": model})


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def _logprobs(job: ChatJob, completion) -> ChatLogprobs | None:
    if not job.request.logprobs:
        return None
    return ChatLogprobs(content=chat_logprobs(completion.token_ids, completion.logprobs or [],
                                              job.request.top_logprobs or 0))


async def complete_chat(aggregator: Aggregator, job: ChatJob) -> ChatCompletionResponse:
    outputs = await aggregator.collect(job.choices)
    choices = []
    completion_tokens = 0
    reasoning_tokens = None
    for choice, output in zip(job.choices, outputs, strict=True):
        completion = output.outputs[0]
        completion_tokens += len(completion.token_ids)
        reader = job.output()
        parts = reader.whole(completion.text)
        message = AssistantMessage(content=parts.content, tool_calls=parts.tool_calls or UNSET)
        if reader.reasons:
            setattr(message, job.reasoning_field, parts.reasoning)
            counted = reader.reasoning_tokens(list(completion.token_ids), parts.reasoning)
            reasoning_tokens = (reasoning_tokens or 0) + (counted or 0)
        choices.append(ChatChoice(index=choice.index, message=message, logprobs=_logprobs(job, completion),
                                  finish_reason=_finish_reason(job, completion.finish_reason, reader.called),
                                  stop_reason=completion.stop_reason))
    job.counts.completion_tokens = completion_tokens
    return ChatCompletionResponse(**job.envelope, choices=choices,
                                  usage=usage(job.choices, completion_tokens, reasoning_tokens))


def _finish_reason(job: ChatJob, reason: str | None, called: bool) -> str | None:
    """"tool_calls" when the model stopped after calling tools; never for a forced (named) tool."""
    return "tool_calls" if called and reason == "stop" and job.tools.kind != "named" else reason


async def stream_chat(aggregator: Aggregator, job: ChatJob) -> AsyncIterator[bytes]:
    """SSE frames: one item per batch of engine outputs; the last (a `Final`) also has the usage."""
    plan = StreamPlan.of(job.request.stream_options)
    generated = {choice.index: 0 for choice in job.choices}
    readers = {choice.index: job.output() for choice in job.choices}  # per-choice parser state
    frames, outbox = ChunkFrames(ChatCompletionChunk, job.envelope), Outbox(len(job.choices))
    started: set[int] = set()

    def frame(choice: Choice, choice_chunk: ChatChunkChoice) -> bytes:
        return frames.frame(choice_chunk, usage([choice], generated[choice.index]) if plan.continuous_usage else None)

    async with aclosing(aggregator.merge(job.choices)) as batches:  # closing the stream aborts the choices
        async for batch in batches:
            ready, finished = [], 0
            for choice, output in batch:
                if choice.index not in started:
                    started.add(choice.index)
                    ready.append(frame(choice, ChatChunkChoice(index=choice.index,
                                                               delta=job.delta(role="assistant", content=""))))
                completion = output.outputs[0]
                generated[choice.index] += len(completion.token_ids)
                finished += output.finished
                if not completion.text and completion.finish_reason is None and not job.request.logprobs:
                    continue
                reader = readers[choice.index]
                parts = reader.delta(completion.text, list(completion.token_ids), completion.finish_reason is not None)
                if not parts and completion.finish_reason is None and not job.request.logprobs:
                    continue  # held back: e.g. the start of what may be a tool-call marker
                finish = _finish_reason(job, completion.finish_reason, reader.called)
                ready.append(frame(choice, ChatChunkChoice(index=choice.index, delta=job.delta(parts),
                                                           logprobs=_logprobs(job, completion), finish_reason=finish)))
            if item := outbox.send(ready, finished):
                yield item
    job.counts.completion_tokens = sum(generated.values())
    closing = []
    if plan.include_usage:
        counts = [r.streamed_reasoning_tokens() for r in readers.values() if r.reasons]
        reasoning = sum(c or 0 for c in counts) if counts else None
        closing.append(frames.usage_frame(usage(job.choices, job.counts.completion_tokens, reasoning)))
    yield outbox.close(*closing)
