"""POST /v1/audio/transcriptions and /v1/audio/translations: the form checked, the audio checked and decoded
(choir/plugins/audio.py), the language detected when none is given and the model can tell, one engine request per
chunk of the model's window (all sent at once, as vLLM does), and the answer in the format asked for
(choir/app/serving/speech_formats.py), or streamed as OpenAI streams a transcript."""

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from choir.app.serving.models import generation_model
from choir.core.errors import bad_request
from choir.core.protocol.audio import TranscriptionForm
from choir.engine.protocol import NO_OPTIONS, Engine, GenerateOptions, Prompt
from choir.engine.sampling import Sampling
from choir.engine.speech import Audio, Segment, Speech, Task
from choir.plugins.pipeline import Pipeline

SEGMENT_FORMATS = ("verbose_json", "srt", "vtt")  # made of the model's timestamped segments


@dataclass(frozen=True, slots=True)
class SpeechPlan:
    """A request ready for the engine: what to generate, and what the answer reports."""

    task: Task
    form: TranscriptionForm
    model: str
    speech: Speech
    audio: Audio
    language: str | None  # the language given or detected (None: the model has no detection and none was given)
    prompts: list[Prompt]
    options: GenerateOptions
    sampling: Sampling

    @property
    def segmented(self) -> bool:
        return self.form.response_format in SEGMENT_FORMATS

    @property
    def prompt_tokens(self) -> int:
        """The decoder prompts' tokens and the audio's, as vLLM counts a transcription's prompt."""
        return sum(len(prompt.token_ids) for prompt in self.prompts) + self.speech.audio_tokens(self.audio.seconds)

    @property
    def separator(self) -> str:
        """Between the chunks' (and segments') texts, as vLLM joins them."""
        return "" if self.language and self.language in self.speech.no_space_languages else " "


@dataclass(slots=True)
class ChunkResult:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    segments: list[Segment]


def check_form(pipeline: Pipeline, form: TranscriptionForm, task: Task) -> tuple[str, Speech, GenerateOptions]:
    """The form's own checks, before the audio is looked at."""
    choice = generation_model(pipeline, form.model)
    speech = pipeline.engine.speech
    if speech is None:
        raise bad_request(f"The model `{choice.name}` does not take audio: serve a speech-to-text model (Whisper, "
                          "...) for /v1/audio/transcriptions and /v1/audio/translations (docs/api/audio.md).", "model")
    fmt = form.response_format
    if fmt in SEGMENT_FORMATS and not speech.timestamps:
        raise bad_request(f"response_format `{fmt}` needs timestamps, which `{choice.name}` does not write: send "
                          "json or text.", "response_format")
    if form.stream and fmt in SEGMENT_FORMATS:
        raise bad_request(f"response_format `{fmt}` cannot be streamed: send json or text with stream.",
                          "response_format")
    if form.timestamp_granularities and fmt != "verbose_json":
        raise bad_request("timestamp_granularities needs response_format `verbose_json`.", "timestamp_granularities")
    if "word" in form.timestamp_granularities:
        raise bad_request("Word timestamps are not served (vLLM's Whisper writes segment timestamps only): send "
                          "timestamp_granularities[]=segment.", "timestamp_granularities")
    if form.include:
        raise bad_request("`include[]=logprobs` is not served for this model.", "include")
    if form.chunking_strategy not in (None, "auto"):
        raise bad_request("chunking_strategy: only `auto` is served (the model's own window; longer audio is "
                          "split at its quietest points).", "chunking_strategy")
    if not 0 <= form.temperature <= 1:
        raise bad_request("temperature must be from 0 to 1.", "temperature")
    if (form.stream_include_usage or form.stream_continuous_usage_stats) and not form.stream:
        raise bad_request("Stream options can only be defined when `stream=True`.",
                          "stream_include_usage" if form.stream_include_usage else "stream_continuous_usage_stats")
    if form.max_completion_tokens is not None and form.max_completion_tokens < 1:
        raise bad_request("max_completion_tokens must be at least 1.", "max_completion_tokens")
    if form.language is not None and form.language.lower() not in speech.languages:
        raise bad_request(f"`{form.language}` is not a language `{choice.name}` knows: send an ISO-639-1 code "
                          f"such as {', '.join(sorted(speech.languages)[:5])}, ...", "language")
    if task == "translate" and form.to_language not in (None, "en"):
        raise bad_request("Translations are into English: leave to_language out.", "to_language")
    return choice.name, speech, GenerateOptions(adapter=choice.adapter) if choice.adapter else NO_OPTIONS


async def plan_speech(pipeline: Pipeline, form: TranscriptionForm, data: bytes, task: Task,
                      request_id: str) -> SpeechPlan:
    model, speech, options = check_form(pipeline, form, task)
    policy = pipeline.audio
    await policy.check(data, "file")
    try:
        audio = await policy.run(speech.decode, data, policy.max_seconds)
    except ValueError as exc:
        raise policy.refused(exc, "file") from None
    engine = pipeline.engine
    language = form.language.lower() if form.language else None
    if language is None and speech.detects_language:
        language = await _detect(engine, speech, audio, f"{request_id}-lang")
    segmented = form.response_format in SEGMENT_FORMATS
    try:
        prompts = await speech.prompts(audio, task, language, form.prompt, timestamps=segmented)
    except ValueError as exc:
        raise bad_request(f"The model refuses the request: {exc}", "language") from None
    longest = max(len(prompt.token_ids) for prompt in prompts)
    room = engine.max_model_len - longest
    if room < 1:
        raise bad_request(f"The prompt takes {longest} of the model's {engine.max_model_len} tokens, leaving none "
                          "for the transcript: shorten it.", "prompt")
    form_max = form.max_completion_tokens
    sampling = Sampling(
        max_tokens=min(room, form_max) if form_max is not None else room, stream=form.stream,
        temperature=form.temperature, top_p=form.top_p, top_k=form.top_k, min_p=form.min_p, seed=form.seed,
        frequency_penalty=form.frequency_penalty, presence_penalty=form.presence_penalty,
        repetition_penalty=form.repetition_penalty, logprobs=0 if segmented else None,
        extra_args=form.vllm_xargs)
    return SpeechPlan(task, form, model, speech, audio, language, prompts, options, sampling)


async def _detect(engine: Engine, speech: Speech, audio: Audio, request_id: str) -> str:
    """The model's language token for the first chunk, among the languages alone (vLLM's detection)."""
    prompt, allowed = await speech.language_probe(audio)
    params = Sampling(max_tokens=1, temperature=0.0, allowed_token_ids=allowed)
    token_ids: list[int] = []
    async for output in engine.generate(prompt, params, request_id):
        token_ids = list(output.outputs[0].token_ids)
    return speech.language_of(token_ids)


def _ids(plan: SpeechPlan, request_id: str) -> list[str]:
    count = len(plan.prompts)
    return [request_id] if count == 1 else [f"{request_id}-{i}" for i in range(count)]


async def run_chunks(pipeline: Pipeline, plan: SpeechPlan, request_id: str) -> list[ChunkResult]:
    """Every chunk's whole output."""
    async def one(index: int, prompt: Prompt, chunk_id: str) -> ChunkResult:
        final = None
        async for output in pipeline.engine.generate(prompt, plan.sampling, chunk_id, plan.options):
            final = output
        assert final is not None
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        segments: list[Segment] = []
        if plan.segmented:
            entries = completion.logprobs or []
            logprobs = [entry[token].logprob for token, entry in zip(token_ids, entries, strict=False)]
            segments = plan.speech.segments(token_ids, logprobs, plan.audio.offsets[index])
        return ChunkResult(plan.speech.clean(completion.text), token_ids, len(prompt.token_ids), segments)

    try:
        async with asyncio.TaskGroup() as group:  # one chunk failing stops the others (aborted in the engine)
            tasks = [group.create_task(one(i, prompt, chunk_id))
                     for i, (prompt, chunk_id) in enumerate(zip(plan.prompts, _ids(plan, request_id), strict=True))]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


async def stream_chunks(pipeline: Pipeline, plan: SpeechPlan,
                        request_id: str) -> AsyncGenerator[tuple[int, str, int], None]:
    """(chunk, text added, tokens added) as the engine writes them, the text through the model's streaming
    post-processor (a new one per chunk): every chunk's request runs at once, the chunks' texts come in order.
    Closing this aborts them all."""
    queues: list[asyncio.Queue[tuple[str, int, bool] | None]] = [asyncio.Queue() for _ in plan.prompts]

    async def feed(prompt: Prompt, chunk_id: str, queue: asyncio.Queue[tuple[str, int, bool] | None]) -> None:
        try:
            async for output in pipeline.engine.generate(prompt, plan.sampling, chunk_id, plan.options):
                completion = output.outputs[0]
                queue.put_nowait((completion.text, len(completion.token_ids), completion.finish_reason is not None))
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(feed(prompt, chunk_id, queue))
             for prompt, chunk_id, queue in zip(plan.prompts, _ids(plan, request_id), queues, strict=True)]
    try:
        for index, (task, queue) in enumerate(zip(tasks, queues, strict=True)):
            cleaner = plan.speech.stream_cleaner()
            while (item := await queue.get()) is not None:
                yield index, cleaner(item[0], item[2]), item[1]
            await task  # its error, if it failed
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

