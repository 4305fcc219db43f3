"""A transcript in the format a request asks for: `json` and `verbose_json` (OpenAI's objects), `text`, and the
subtitle formats `srt` and `vtt` made of the model's timestamped segments (vLLM's server serves neither)."""

import math
from collections.abc import AsyncGenerator
from contextlib import aclosing

import msgspec

from choir.app.serving.counts import TokenCounts
from choir.app.serving.speech import ChunkResult, SpeechPlan
from choir.app.serving.streaming import data_frame
from choir.core.protocol.audio import (
    AudioDuration,
    AudioTokens,
    TranscriptDelta,
    TranscriptDone,
    Transcription,
    TranscriptionSegment,
    TranscriptionVerbose,
)
from choir.engine.speech import Segment

MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json", "text": "text/plain",
               "srt": "text/plain", "vtt": "text/plain"}


def answer(plan: SpeechPlan, results: list[ChunkResult]) -> bytes:
    """The body, of MEDIA_TYPES[plan.form.response_format]."""
    fmt = plan.form.response_format
    segments = [_wire(i, segment, plan, offset) for i, (segment, offset) in enumerate(
        (s, plan.audio.offsets[chunk]) for chunk, r in enumerate(results) for s in r.segments)]
    parts = [segment.text for segment in segments] if plan.segmented else [result.text for result in results]
    text = joined(parts, plan.separator)
    if fmt == "text":
        return (text + "\n").encode()
    if fmt == "srt":
        return _subtitles(segments, srt=True).encode()
    if fmt == "vtt":
        return _subtitles(segments, srt=False).encode()
    usage = _duration(plan) if plan.task == "transcribe" else None
    if fmt == "verbose_json":
        return msgspec.json.encode(TranscriptionVerbose(
            task=plan.task, language=_language_name(plan), duration=round(plan.audio.seconds, 3), text=text,
            segments=segments, usage=usage))
    return msgspec.json.encode(Transcription(text=text, usage=usage))


def joined(parts: list[str], separator: str) -> str:
    """The texts of chunks (or segments) in order, `separator` between them (vLLM's: a space, none for the
    languages written without), not doubled where a text brings its own leading space, as Whisper's do."""
    text = parts[0] if parts else ""
    for part in parts[1:]:
        part = part.lstrip()
        if part:
            text = text.rstrip() + separator + part if text.strip() else part
    return text


def _duration(plan: SpeechPlan) -> AudioDuration:
    return AudioDuration(seconds=math.ceil(plan.audio.seconds))  # rounded up, as OpenAI bills it


def _language_name(plan: SpeechPlan) -> str:
    """OpenAI names the language (`english`); a model that detects none reports `unknown`."""
    code = plan.language
    return plan.speech.languages.get(code, code).lower() if code else "unknown"


def _wire(index: int, segment: Segment, plan: SpeechPlan, offset: float) -> TranscriptionSegment:
    """`seek`: where the segment's chunk starts, in seconds (vLLM's reading of Whisper's field)."""
    return TranscriptionSegment(
        id=index, seek=int(offset), start=round(segment.start, 3), end=round(segment.end, 3),
        text=segment.text, tokens=segment.tokens, temperature=plan.form.temperature,
        avg_logprob=segment.avg_logprob, compression_ratio=segment.compression_ratio)


def _timestamp(seconds: float, srt: bool) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{',' if srt else '.'}{millis:03d}"


def _subtitles(segments: list[TranscriptionSegment], srt: bool) -> str:
    """SubRip (numbered cues, `,` before the milliseconds) or WebVTT (a header, `.`)."""
    cues = []
    for number, segment in enumerate(segments, start=1):
        timing = f"{_timestamp(segment.start, srt)} --> {_timestamp(segment.end, srt)}"
        text = "\n".join(line for line in segment.text.strip().splitlines() if line.strip())  # a blank line ends a cue
        cues.append(f"{number}\n{timing}\n{text}\n" if srt else f"{timing}\n{text}\n")
    return "\n".join(cues) if srt else "WEBVTT\n\n" + "\n".join(cues)


async def event_frames(plan: SpeechPlan, deltas: AsyncGenerator[tuple[int, str, int], None],
                       counts: TokenCounts) -> AsyncGenerator[bytes, None]:
    """OpenAI's transcript events: `transcript.text.delta` per piece of text, then `transcript.text.done` with
    the whole text and its token usage (the audio's tokens counted as vLLM counts them)."""
    texts: list[str] = []
    current, completion_tokens, pending = 0, 0, False  # pending: a chunk began, its first text needs the separator
    async with aclosing(deltas):
        async for index, text, tokens in deltas:
            completion_tokens += tokens
            if index != current:
                current, pending = index, True
            if pending and text:
                pending = False
                if plan.separator and texts:
                    text = plan.separator + text.lstrip() if not texts[-1].endswith(plan.separator) else text.lstrip()
            if text:
                texts.append(text)
                yield data_frame(msgspec.json.encode(TranscriptDelta(delta=text)))
    counts.completion_tokens = completion_tokens
    prompt_tokens = plan.prompt_tokens
    usage = AudioTokens(input_tokens=prompt_tokens, output_tokens=completion_tokens,
                        total_tokens=prompt_tokens + completion_tokens)
    yield data_frame(msgspec.json.encode(TranscriptDone(text="".join(texts), usage=usage)))

