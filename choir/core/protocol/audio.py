"""/v1/audio/transcriptions and /v1/audio/translations wire types: OpenAI's, with vLLM's sampling extras in the
form (TranscriptionForm: the form's fields, read from multipart as strings and converted leniently, as a form's
values are)."""

from typing import Annotated, Any, Literal

import msgspec

from choir.core.protocol.common import Seed

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]


class TranscriptionForm(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The form's fields besides `file` (a translation takes the same, `language` aside)."""

    model: str | None = None
    language: str | None = None
    prompt: str = ""
    response_format: ResponseFormat = "json"
    temperature: float = 0.0
    timestamp_granularities: list[Literal["segment", "word"]] = msgspec.field(default_factory=list,
                                                                            name="timestamp_granularities[]")
    stream: bool = False
    chunking_strategy: str | None = None  # "auto": the model's own window (the one Choir serves)
    include: list[Literal["logprobs"]] = msgspec.field(default_factory=list, name="include[]")
    # vLLM's sampling extras (its TranscriptionRequest's)
    seed: Seed | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    max_completion_tokens: int | None = None
    stream_include_usage: bool = False
    stream_continuous_usage_stats: bool = False
    vllm_xargs: dict[str, Any] | None = None
    request_id: str | None = None
    to_language: str | None = None


class TranscriptionUpload(TranscriptionForm, kw_only=True):
    """The whole form, as the spec describes it: the fields and the audio file."""

    file: Annotated[bytes, msgspec.Meta(extra_json_schema={"type": "string", "format": "binary"})]


class AudioDuration(msgspec.Struct, kw_only=True):
    type: Literal["duration"] = "duration"
    seconds: int  # the audio's length, rounded up (as OpenAI bills it)


class AudioTokens(msgspec.Struct, kw_only=True):
    type: Literal["tokens"] = "tokens"
    input_tokens: int
    output_tokens: int
    total_tokens: int


class Transcription(msgspec.Struct, kw_only=True, omit_defaults=True):
    text: str
    usage: AudioDuration | None = None  # a translation has none (as OpenAI's)


class TranscriptionSegment(msgspec.Struct, kw_only=True):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None = None  # Whisper's no-speech detection is not run (nor by vLLM)


class TranscriptionVerbose(msgspec.Struct, kw_only=True, omit_defaults=True):
    task: Literal["transcribe", "translate"]
    language: str
    duration: float
    text: str
    segments: list[TranscriptionSegment]
    usage: AudioDuration | None = None


class TranscriptDelta(msgspec.Struct, kw_only=True, tag_field="type", tag="transcript.text.delta"):
    delta: str


class TranscriptDone(msgspec.Struct, kw_only=True, tag_field="type", tag="transcript.text.done",
                     omit_defaults=True):
    text: str
    usage: AudioTokens | None = None


TranscriptEvent = TranscriptDelta | TranscriptDone
