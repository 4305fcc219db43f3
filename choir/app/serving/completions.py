"""POST /v1/completions: prompts → choices on the engine → a response or an SSE stream."""

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass

import msgspec

from choir.app.serving.best_of import best_of_candidates, keep_best, ranking_logprobs
from choir.app.serving.counts import TokenCounts
from choir.app.serving.jobs import Job
from choir.app.serving.json_text import JsonEscaper
from choir.app.serving.logprobs import CompletionLogprobsBuilder, wire_prompt_logprobs
from choir.app.serving.prompts import check_common, completion_prompts
from choir.app.serving.sampling import (
    build_sampling_params,
    check_prompt_fits,
    check_prompt_logprobs,
    generate_options,
    render_options,
    resolve_max_tokens,
)
from choir.app.serving.streaming import ChunkFrames, Outbox, StreamPlan
from choir.app.serving.structured import structured_outputs
from choir.core.errors import bad_request
from choir.core.protocol.completions import CompletionChoice, CompletionChunk, CompletionRequest, CompletionResponse
from choir.engine.outputs import EngineOutput, Position
from choir.engine.protocol import Engine, Prompt
from choir.engine.sampling import is_json
from choir.plugins.aggregation import Aggregator, cached_tokens, usage
from choir.plugins.fanout import Choice, PromptRequest
from choir.plugins.pipeline import Pipeline


@dataclass(frozen=True, kw_only=True)
class CompletionJob(Job):
    request: CompletionRequest
    echo_only: bool  # max_tokens=0 with echo: the engine runs one token, which is dropped


async def plan_completion(pipeline: Pipeline, request: CompletionRequest, response_id: str,
                          created: int) -> CompletionJob:
    engine, fan_out, compat = pipeline.engine, pipeline.fan_out, pipeline.compat
    model = check_common(pipeline, request)
    candidates = best_of_candidates(request)
    fan_out.check(candidates or request.n, request.seed)
    if request.suffix is not None:
        raise bad_request("suffix is not supported: this server has no fill-in-the-middle model.", "suffix")
    requested = 16 if request.max_tokens is None else request.max_tokens
    if requested == 0 and not request.echo:
        raise bad_request("max_tokens must be at least 1 (0 is allowed only with echo).", "max_tokens")
    raw_prompts = completion_prompts(request.prompt)
    fan_out.check_prompts(len(raw_prompts), candidates or request.n)
    wanted_prompt_logprobs = check_prompt_logprobs(request)
    if wanted_prompt_logprobs is None and request.echo and request.logprobs is not None:
        wanted_prompt_logprobs = request.logprobs  # echoed tokens get logprobs too
    render = render_options(request, chat=False, max_model_len=engine.max_model_len, max_tokens=requested,
                            detokenize=request.echo)
    prompts = await engine.render_completion(raw_prompts, render)
    if request.echo and compat.rules.echo_special_tokens == "skip":
        prompts = [_without_special_tokens(engine, prompt) if isinstance(raw, list) else prompt
                   for raw, prompt in zip(raw_prompts, prompts, strict=True)]
    constraint = structured_outputs(request)
    options = generate_options(request, engine.priority_scheduling, adapter=model.adapter)
    requests = []
    for index, prompt in enumerate(prompts):
        check_prompt_fits(len(prompt.token_ids), engine.max_model_len, "prompt")
        max_tokens = resolve_max_tokens(max(requested, 1), len(prompt.token_ids), engine.max_model_len, "max_tokens")
        params = build_sampling_params(
            request, max_tokens=max_tokens, logprobs=ranking_logprobs(request.logprobs, candidates),
            prompt_logprobs=wanted_prompt_logprobs, structured_outputs=constraint)
        request_id = response_id if len(prompts) == 1 else f"{response_id}-{index}"
        requests.append(PromptRequest(prompt_index=index, prompt=prompt, params=params, request_id=request_id,
                                      options=options))
    fingerprint = compat.system_fingerprint(engine.engine_name, engine.version, engine.model_root,
                                            engine.max_model_len)
    choices = fan_out.choices(requests, candidates or request.n, engine.data_parallel_size)
    return CompletionJob(request=request, model=model.name, response_id=response_id, created=created,
                         choices=choices, system_fingerprint=fingerprint,
                         echo_only=requested == 0, keep=request.n if candidates else None, compat=compat)


def _without_special_tokens(engine: Engine, prompt: Prompt) -> Prompt:
    """A token-id prompt echoed as SGLang echoes it: its text without special tokens (no `<s>`)."""
    return msgspec.structs.replace(prompt, text=engine.detokenize(prompt.token_ids, skip_special_tokens=True))


class _ChoiceText:
    """One choice's text and logprobs, built from engine outputs (whole or delta)."""

    __slots__ = ("job", "choice", "engine", "logprobs", "started", "escaper", "nulls")

    def __init__(self, job: CompletionJob, choice: Choice, engine: Engine) -> None:
        self.job, self.choice, self.engine = job, choice, engine
        request = job.request
        self.logprobs = None if request.logprobs is None else \
            CompletionLogprobsBuilder(as_token_ids=bool(request.return_tokens_as_token_ids))
        self.started = False
        # Text constrained to JSON comes out as strict JSON (choir/app/serving/json_text.py).
        self.escaper = JsonEscaper() if is_json(choice.params.structured_outputs) else None
        self.nulls = job.compat.nulls(CompletionChoice)  # fields the profile sends as null

    def render(self, output: EngineOutput, prompt_logprobs: Sequence[Position | None] | None) -> CompletionChoice:
        completion = output.outputs[0]
        text, token_ids = completion.text, list(completion.token_ids)
        positions: Sequence[Position | None] | None = completion.logprobs
        if self.escaper is not None:
            text = self.escaper.feed(text)
        finish_reason = completion.finish_reason
        if self.job.echo_only:
            text, token_ids, positions, finish_reason = "", [], [], finish_reason and "length"
        logprobs = None
        if not self.started and self.job.request.echo:
            prompt = self.choice.prompt
            text = (prompt.text or "") + text
            if self.logprobs is not None:
                prompt_positions = list(prompt_logprobs or [None] * len(prompt.token_ids))
                fallback = self.engine.token_strings(prompt.token_ids)
                positions = [*prompt_positions, *(positions or [])]
                token_ids = [*prompt.token_ids, *token_ids]
                logprobs = self.logprobs.build(text, token_ids, positions, fallback)
        if logprobs is None and self.logprobs is not None:
            logprobs = self.logprobs.build(text, token_ids, positions or [])
        rendered = CompletionChoice(index=self.choice.index, text=text, logprobs=logprobs,
                                    finish_reason=finish_reason, stop_reason=completion.stop_reason, **self.nulls)
        request = self.job.request
        if request.return_token_ids:
            rendered.token_ids = [] if self.job.echo_only else list(completion.token_ids)
            if not self.started:
                rendered.prompt_token_ids = list(self.choice.prompt.token_ids)
        if request.prompt_logprobs is not None and not self.started:
            rendered.prompt_logprobs = wire_prompt_logprobs(prompt_logprobs)
        self.started = True
        return rendered


def _completion_tokens(job: CompletionJob, output: EngineOutput) -> int:
    return 0 if job.echo_only else len(output.outputs[0].token_ids)


async def complete(engine: Engine, aggregator: Aggregator, job: CompletionJob,
                   counts: TokenCounts) -> CompletionResponse:
    outputs = await aggregator.collect(job.choices)
    completion_tokens = counts.completion_tokens = sum(_completion_tokens(job, output) for output in outputs)
    cached = cached_tokens(job.choices, [output.num_cached_tokens for output in outputs])
    choices = job.choices
    if job.keep is not None:
        choices, outputs = keep_best(choices, outputs, job.keep)
    rendered = [_ChoiceText(job, choice, engine).render(output, output.prompt_logprobs)
                for choice, output in zip(choices, outputs, strict=True)]
    return CompletionResponse(**job.envelope, choices=rendered, usage=usage(job.choices, completion_tokens,
                                                                            cached=cached))


async def stream_completion(engine: Engine, aggregator: Aggregator, job: CompletionJob,
                            counts: TokenCounts) -> AsyncGenerator[bytes, None]:
    """SSE frames: one item per batch of engine outputs; the last (a `Final`) also has the usage."""
    plan = StreamPlan.of(job.request.stream_options)
    states = {choice.index: _ChoiceText(job, choice, engine) for choice in job.choices}
    generated = dict.fromkeys(states, 0)
    cached: dict[int, int | None] = {}  # per choice, from its first output
    frames, outbox = ChunkFrames(CompletionChunk, job.envelope), Outbox(len(job.choices))

    async with aclosing(aggregator.merge(job.choices)) as batches:  # closing the stream aborts the choices
        async for batch in batches:
            ready, finished = [], 0
            for choice, output in batch:
                cached.setdefault(choice.index, output.num_cached_tokens)
                rendered = states[choice.index].render(output, output.prompt_logprobs)
                generated[choice.index] += _completion_tokens(job, output)
                finished += output.finished
                has_logprobs = bool(rendered.logprobs and rendered.logprobs.tokens)
                if not (rendered.text or rendered.finish_reason or has_logprobs or rendered.token_ids):
                    continue
                running = usage([choice], generated[choice.index]) if plan.continuous_usage else None
                ready.append(frames.frame(rendered, running))
            if item := outbox.send(ready, finished):
                yield item
    counts.completion_tokens = sum(generated.values())
    closing = b""
    if plan.include_usage:
        firsts = [cached.get(choice.index) for choice in job.choices]
        closing = frames.usage_frame(usage(job.choices, counts.completion_tokens,
                                           cached=cached_tokens(job.choices, firsts)))
    yield outbox.close(closing)
