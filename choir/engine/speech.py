"""What Choir needs from an engine whose model turns speech into text (Whisper and the other models vLLM serves
on /v1/audio/transcriptions): the seam's side of it. `VllmSpeech` (choir/engine/vllm/speech.py) implements it
with the model class's own prompts, chunking and post-processing; the serving side (choir/app/serving/speech.py)
reads the form, checks the audio, generates and writes the answer."""

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from choir.engine.prompt import Prompt

Task = Literal["transcribe", "translate"]


@dataclass(frozen=True, slots=True)
class Audio:
    """An upload decoded to the model's sample rate, split where the model's window ends."""

    chunks: list[Any]  # each a waveform the engine's prompts take
    offsets: list[float]  # where each chunk starts, in seconds
    seconds: float  # the whole audio's length


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of the transcript between two timestamps the model wrote (verbose_json, srt, vtt)."""

    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    compression_ratio: float


class Speech(Protocol):
    sample_rate: int
    window_seconds: float | None  # audio longer than this is split (None: never)
    languages: dict[str, str]  # the ISO 639-1 codes the model is made for, and their names (English)
    detects_language: bool  # without `language`, the model is asked for it first
    timestamps: bool  # the model writes timestamps: segments (verbose_json, srt, vtt) can be served
    no_space_languages: frozenset[str]  # the chunks of a transcript in these are joined with no space

    def decode(self, data: bytes, max_seconds: float) -> Audio:
        """Decoded, resampled and split: CPU work for a worker thread. ValueError: not audio this can read,
        or longer than `max_seconds`."""
        ...

    async def prompts(self, audio: Audio, task: Task, language: str | None, prompt: str,
                      timestamps: bool) -> list[Prompt]:
        """One prompt per chunk. ValueError naming what the model refuses (a language, a prompt too long)."""
        ...

    async def language_probe(self, audio: Audio) -> tuple[Prompt, list[int]]:
        """A prompt whose one generated token, among the allowed ids, is the spoken language."""
        ...

    def language_of(self, token_ids: list[int]) -> str: ...

    def segments(self, token_ids: list[int], logprobs: list[float], offset: float) -> list[Segment]:
        """The timestamped segments of one chunk's output (`logprobs`: each token's, in order)."""
        ...

    def clean(self, text: str) -> str:
        """One chunk's text as the model's own post-processing leaves it."""
        ...

    def stream_cleaner(self) -> Callable[[str, bool], str]:
        """For one chunk's stream: (text added, finished) → the text to send, as the model's streaming
        post-processor leaves it."""
        ...

    def audio_tokens(self, seconds: float) -> int:
        """What the audio counts for in a stream's prompt_tokens, as vLLM counts it (0: nothing)."""
        ...


@dataclass(frozen=True, slots=True)
class Transcribed:
    """One step of a streamed transcript."""

    text: str  # the text added
    tokens: int  # the tokens added
    prompt_tokens: int  # the request's prompt so far: each segment of audio adds its own


class Realtime(Protocol):
    """What Choir needs from an engine whose model transcribes audio as it streams in (vLLM's SupportsRealtime:
    Qwen3-ASR, Voxtral realtime), for /v1/realtime: `VllmRealtime` (choir/engine/vllm/realtime.py) implements
    it with the model class's own buffering and prompts; choir/app/serving/realtime.py runs the websocket."""

    sample_rate: int  # of the PCM16 the client sends (mono, little-endian)

    def samples(self, pcm16: bytes) -> Any:
        """The client's PCM16 as the waveform `transcribe` takes (even-length bytes)."""
        ...

    def transcribe(self, audio: AsyncIterator[Any], request_id: str) -> AsyncGenerator[Transcribed, None]:
        """One engine request over the whole stream of waveforms, ended when `audio` ends: the model's own
        segments as they fill, its text as it writes it. Closing the generator aborts the request."""
        ...
