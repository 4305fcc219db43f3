"""POST /v1/chat/completions: messages → the chat template → choices on the engine → a response or SSE."""

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import msgspec

from choir.app.serving.best_of import best_of_candidates, keep_best, ranking_logprobs
from choir.app.serving.chat_output import ChoiceOutput
from choir.app.serving.counts import TokenCounts
from choir.app.serving.jobs import Job
from choir.app.serving.logprobs import chat_logprobs, wire_prompt_logprobs
from choir.app.serving.prompts import check_common
from choir.app.serving.sampling import (
    build_sampling_params,
    check_prompt_fits,
    check_prompt_logprobs,
    generate_options,
    render_options,
    resolve_max_tokens,
)
from choir.app.serving.streaming import ChunkFrames, Outbox, StreamPlan
from choir.app.serving.structured import calls_or_format, structured_outputs
from choir.app.serving.tools import ToolPlan, plan_tools
from choir.app.serving.unserved import CHAT_UNSERVED, refuse_unserved
from choir.core.compat import OperationCompat
from choir.core.errors import bad_request
from choir.core.protocol import without_none
from choir.core.protocol.chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    JsonObjectFormat,
    JsonSchemaFormat,
)
from choir.core.protocol.common import FinishReason
from choir.engine.outputs import FinishReason as EngineFinish
from choir.engine.outputs import SampleOutput
from choir.engine.parsing import Parsers, RequestParsers
from choir.engine.protocol import ChatTemplateOptions
from choir.engine.sampling import Constraint, is_json
from choir.plugins.aggregation import Aggregator, cached_tokens, usage
from choir.plugins.fanout import Choice, PromptRequest
from choir.plugins.media import render_images
from choir.plugins.pipeline import Pipeline


@dataclass(frozen=True, kw_only=True)
class ChatJob(Job):
    request: ChatCompletionRequest
    tools: ToolPlan
    parsers: RequestParsers | None = None  # the configured parsers, bound to this request
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # what the chat template (and parsers) saw
    role: str = "assistant"  # the answer's role: the server's response role, as vLLM's get_chat_request_role

    def output(self) -> ChoiceOutput:
        first = self.choices[0]
        # The engine was told to constrain from the first token: the output has no reasoning to read.
        return ChoiceOutput(self.tools, self.parsers, first.prompt.token_ids, self.request.include_reasoning,
                            no_reasoning=first.options.reasoning_ended is True,
                            json_content=is_json(first.params.structured_outputs) or self.answers_in_json,
                            separate_reasoning=self.request.separate_reasoning,
                            stream_reasoning=self.request.stream_reasoning)

    @property
    def answers_in_json(self) -> bool:
        """tool_choice auto with a JSON response format: what is not a call is JSON (a structural tag's branch)."""
        return self.tools.kind == "auto" and isinstance(self.request.response_format,
                                                        (JsonObjectFormat, JsonSchemaFormat))

    def shows_tokens(self, reader: ChoiceOutput) -> bool:
        """include_reasoning false hides a reasoning choice's tokens and logprobs too: they hold the reasoning."""
        return self.request.include_reasoning or not reader.reasons


def _check_unsupported(request: ChatCompletionRequest, compat: OperationCompat) -> None:
    refuse_unserved(request, CHAT_UNSERVED)
    compat.check_roles([message.role for message in request.messages])
    if request.top_logprobs and not request.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true.", "top_logprobs")


def _messages(request: ChatCompletionRequest) -> tuple[list[dict[str, Any]], bool]:
    """The messages for the chat template, and whether they hold images or audio."""
    messages = without_none(msgspec.to_builtins(request.messages))
    images = False
    for message in messages:
        content = message.get("content")
        if content.__class__ is list:
            for part in content:
                if part["type"] == "image_url":
                    images = True
                    part["image_url"].pop("detail", None)  # vLLM ignores it (and warns, per request)
                elif part["type"] != "text":
                    images = True  # audio: media all the same
        # templates read either name (vLLM's server gives them both)
        reasoning = message.get("reasoning", message.get("reasoning_content"))
        if reasoning is not None:
            message["reasoning"] = message["reasoning_content"] = reasoning
    return messages, images


def template_kwargs(request: ChatCompletionRequest, tools: ToolPlan,
                    defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the chat template is given besides the messages, as vLLM's server gives it: the server's defaults
    under the request's kwargs, the tools, `documents`, and `reasoning_effort` (which also sets
    `enable_thinking`). The parsers are given the same."""
    kwargs = {**(defaults or {}), **(request.chat_template_kwargs or {})}
    if tools.template_tools:
        kwargs.setdefault("tools", tools.template_tools)
    if request.documents is not None:
        kwargs["documents"] = request.documents
    if request.reasoning_effort is not None:
        kwargs["reasoning_effort"] = request.reasoning_effort
        kwargs.setdefault("enable_thinking", request.reasoning_effort != "none")
    return kwargs


async def plan_chat(pipeline: Pipeline, request: ChatCompletionRequest, response_id: str, created: int,
                    image_names: list[str] | None = None, audio_names: list[str] | None = None) -> ChatJob:
    """`image_names`, `audio_names`: where the request's images and audio parts came from, for a chat request
    translated from another API's."""
    engine, fan_out, compat = pipeline.engine, pipeline.fan_out, pipeline.compat
    model = check_common(pipeline, request)
    candidates = best_of_candidates(request)
    fan_out.check(candidates or request.n, request.seed)
    _check_unsupported(request, compat)
    wanted_prompt_logprobs = check_prompt_logprobs(request)
    parsers: Parsers | None = pipeline.parsers
    tools = plan_tools(request, parsers.tool_name if parsers is not None else None)
    kwargs = template_kwargs(request, tools, pipeline.defaults.chat_template_kwargs)
    template = ChatTemplateOptions(add_generation_prompt=request.add_generation_prompt,
                                   continue_final_message=request.continue_final_message, kwargs=kwargs,
                                   media_io_kwargs=request.media_io_kwargs,
                                   mm_processor_kwargs=request.mm_processor_kwargs)
    requested: int | None = request.max_completion_tokens
    param = "max_completion_tokens"
    if requested is None:
        requested, param = request.max_tokens, "max_tokens"
    if requested == 0:
        raise bad_request(f"{param} must be at least 1.", param)
    render = render_options(request, chat=True, max_model_len=engine.max_model_len, max_tokens=requested)
    messages, images = _messages(request)
    if images or request.mm_processor_kwargs or request.media_io_kwargs:
        names = await pipeline.media.prepare(messages, engine.max_images, request.mm_processor_kwargs,
                                             request.media_io_kwargs, image_names)
        names += await pipeline.audio.prepare(messages, engine.max_audios, audio_names)
        prompt = await render_images(engine, messages, template, render, names)
    else:
        prompt = await engine.render_chat(messages, template, render)  # EngineRejected names `messages`
    check_prompt_fits(len(prompt.token_ids), engine.max_model_len, "messages")
    max_tokens = resolve_max_tokens(requested, len(prompt.token_ids), engine.max_model_len, param)
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    constraint = structured_outputs(request, tools.schema)
    bound = None
    if parsers is not None:
        bound = parsers.bind(request, model.name, kwargs)
        if tools.kind == "auto" and is_json(constraint) and request.structured_outputs is None:
            constraint = calls_or_format(constraint, bound, parsers.tool_name)
    params = build_sampling_params(request, max_tokens=max_tokens, logprobs=ranking_logprobs(logprobs, candidates),
                                   prompt_logprobs=wanted_prompt_logprobs, structured_outputs=constraint)
    options = generate_options(request, engine.priority_scheduling, model.adapter,
                               *_reasoning_for_engine(request, parsers, bound, kwargs, prompt.token_ids, constraint))
    single = PromptRequest(prompt_index=0, prompt=prompt, params=params, request_id=response_id, options=options)
    fingerprint = compat.system_fingerprint(engine.engine_name, engine.version, engine.model_root,
                                            engine.max_model_len)
    choices = fan_out.choices([single], candidates or request.n, engine.data_parallel_size)
    return ChatJob(request=request, model=model.name, response_id=response_id, created=created,
                   choices=choices, system_fingerprint=fingerprint,
                   keep=request.n if candidates else None, compat=compat, tools=tools, parsers=bound,
                   template_kwargs=kwargs,
                   # The server's --response-role when the template opens an answer, else the role of the message
                   # the answer continues (vLLM's rule)
                   role=pipeline.defaults.response_role if request.add_generation_prompt else request.messages[-1].role)


def _reasoning_for_engine(request: ChatCompletionRequest, parsers: Parsers | None, bound: RequestParsers | None,
                          kwargs: dict[str, Any], prompt_ids: list[int],
                          constraint: Constraint | None) -> tuple[bool | None, dict[str, Any] | None]:
    """With a reasoning parser the engine constrains only what follows the reasoning: tell it what
    vLLM's server tells it, whether the prompt already ended the reasoning, and the template kwargs
    its own parser needs (`reasoning_ended`, `reasoning_parser_kwargs`). include_reasoning false
    constrains from the first token."""
    if constraint is None or parsers is None or bound is None or not parsers.reasons:
        return None, None
    if not request.include_reasoning:
        return True, {"chat_template_kwargs": kwargs}
    return bound.reasoning_ended(prompt_ids), {"chat_template_kwargs": kwargs}


def choice_logprobs(job: ChatJob, completion: SampleOutput) -> ChatLogprobs | None:
    request = job.request
    if not request.logprobs:
        return None
    # every candidate the engine returned: the ids of logprob_token_ids, or the vocabulary (-1)
    top = None if request.logprob_token_ids or request.top_logprobs == -1 else (request.top_logprobs or 0)
    return ChatLogprobs(content=chat_logprobs(completion.token_ids, completion.logprobs or [], top,
                                              bool(request.return_tokens_as_token_ids)))


async def complete_chat(aggregator: Aggregator, job: ChatJob, counts: TokenCounts) -> ChatCompletionResponse:
    outputs = await aggregator.collect(job.choices)
    request = job.request
    counts.completion_tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    cached = cached_tokens(job.choices, [output.num_cached_tokens for output in outputs])
    choices, kept = (job.choices, outputs) if job.keep is None else keep_best(job.choices, outputs, job.keep)
    rendered = []
    reasoning_tokens = None
    for choice, output in zip(choices, kept, strict=True):
        completion = output.outputs[0]
        reader = job.output()
        parts = reader.whole(completion.text)
        message = job.compat.message(parts.content, parts.tool_calls, parts.reasoning, reader.reasons, job.role)
        if reader.reasons:
            counted = reader.reasoning_tokens(list(completion.token_ids), reader.read_reasoning)
            reasoning_tokens = (reasoning_tokens or 0) + (counted or 0)
        shown = job.shows_tokens(reader)
        answer = ChatChoice(index=choice.index, message=message,
                            logprobs=choice_logprobs(job, completion) if shown else None,
                            finish_reason=_finish_reason(job, completion.finish_reason, reader.called),
                            stop_reason=completion.stop_reason, **job.compat.nulls(ChatChoice))
        if request.return_token_ids and shown:
            answer.token_ids = list(completion.token_ids)
        rendered.append(answer)
    response = ChatCompletionResponse(**job.envelope, choices=rendered,
                                      usage=usage(job.choices, counts.completion_tokens, reasoning_tokens, cached),
                                      **job.compat.nulls(ChatCompletionResponse))
    if request.return_token_ids:
        response.prompt_token_ids = list(job.choices[0].prompt.token_ids)
    if request.prompt_logprobs is not None:
        response.prompt_logprobs = wire_prompt_logprobs(outputs[0].prompt_logprobs)
    return response


def _finish_reason(job: ChatJob, reason: EngineFinish | None, called: bool) -> FinishReason | None:
    """"tool_calls" when the model stopped after calling tools; never for a forced (named) tool.
    Otherwise the engine's reason (stop, length, abort, repetition)."""
    return "tool_calls" if called and reason == "stop" and job.tools.kind != "named" else reason


async def stream_chat(aggregator: Aggregator, job: ChatJob,
                      counts: TokenCounts) -> AsyncGenerator[bytes, None]:
    """SSE frames: one item per batch of engine outputs; the last (a `Final`) also has the usage."""
    plan = StreamPlan.of(job.request.stream_options)
    request = job.request
    generated = {choice.index: 0 for choice in job.choices}
    cached: dict[int, int | None] = {}
    readers = {choice.index: job.output() for choice in job.choices}  # per-choice parser state
    frames, outbox = ChunkFrames(ChatCompletionChunk, job.envelope), Outbox(len(job.choices))
    started: set[int] = set()
    nulls = job.compat.nulls(ChatChunkChoice)

    # The loop below runs once a token per choice (64 times for 16 tokens at n = 4): what it can, it reads once.
    continuous, always_shown = plan.continuous_usage, request.include_reasoning
    compat_delta, frame = job.compat.delta, frames.frame

    async with aclosing(aggregator.merge(job.choices)) as batches:  # closing the stream aborts the choices
        async for batch in batches:
            ready, finished = [], 0
            for choice, output in batch:
                index = choice.index
                reader = readers[index]
                shown = always_shown or not reader.reasons  # job.shows_tokens(reader)
                if index not in started:
                    started.add(index)
                    cached[index] = output.num_cached_tokens
                    ready.append(_first_frame(job, frames, choice, continuous))
                completion = output.outputs[0]
                generated[index] += len(completion.token_ids)
                finished += output.finished
                token_ids = request.return_token_ids and shown and bool(completion.token_ids)
                logprobs = request.logprobs and shown
                ending = completion.finish_reason is not None
                extra = ending or logprobs or token_ids
                if not completion.text and not extra:
                    continue
                parts = reader.delta(completion.text, list(completion.token_ids), ending)
                if not extra and not parts:
                    continue  # held back: e.g. the start of what may be a tool-call marker
                finish = _finish_reason(job, completion.finish_reason, reader.called) if ending else None
                delta = compat_delta({}, parts.content, parts.reasoning, parts.tool_calls)
                chunk = ChatChunkChoice(index=index, delta=delta, finish_reason=finish,
                                        logprobs=choice_logprobs(job, completion) if logprobs else None, **nulls)
                if token_ids:
                    chunk.token_ids = list(completion.token_ids)
                ready.append(frame(chunk, usage([choice], generated[index]) if continuous else None))
            if item := outbox.send(ready, finished):
                yield item
    counts.completion_tokens = sum(generated.values())
    closing = []
    if plan.include_usage:
        reasoned = [r.streamed_reasoning_tokens() for r in readers.values() if r.reasons]
        reasoning = sum(c or 0 for c in reasoned) if reasoned else None
        prompt_cached = cached_tokens(job.choices, [cached.get(choice.index) for choice in job.choices])
        closing.append(frames.usage_frame(usage(job.choices, counts.completion_tokens, reasoning, prompt_cached)))
    yield outbox.close(*closing)


def _first_frame(job: ChatJob, frames: ChunkFrames, choice: Choice, continuous_usage: bool) -> bytes:
    """A choice's role chunk: with return_token_ids it also carries the prompt's token ids, with
    continuous usage stats the prompt's count (nothing generated yet)."""
    first = ChatChunkChoice(index=choice.index, delta=job.compat.delta({"role": job.role, "content": ""}))
    running = usage([choice], 0) if continuous_usage else None
    if job.request.return_token_ids:
        return frames.frame_with(first, prompt_token_ids=list(choice.prompt.token_ids), usage=running)
    nulls = job.compat.nulls(ChatCompletionChunk)
    return frames.frame_with(first, usage=running, **nulls) if nulls else frames.frame(first, running)
