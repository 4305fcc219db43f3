"""Audio in a request, checked before any decoder runs, and decoded off the event loop a few at a time.

An upload is bounded while it streams in (CHOIR_MAX_AUDIO_BYTES). Then only its container's header is read:
what it is (soundfile's formats: WAV, FLAC, OGG, MP3; else FFmpeg's, through PyAV: MP4/M4A, WebM, ...) and,
where the container says, how long it is (CHOIR_MAX_AUDIO_SECONDS). Decoding (the engine's: vLLM's loader,
which also stops at the bound when no header said the length) runs in this policy's own threads, `decodes` at
a time, so a burst of uploads waits for them and never for the event loop or the threads text requests use.
"""

import asyncio
import base64
import binascii
import io
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from choir.core.errors import APIError
from choir.core.protocol.chat import AUDIO_PARTS

T = TypeVar("T")
HEARS_NOTHING = ("The served model takes no audio: serve an audio-language model (Qwen2-Audio, Ultravox, ...) to send "
                 "it, or a speech-to-text model for /v1/audio/transcriptions (docs/api/audio.md).")


class AudioRefused(APIError):
    """Audio the request may not send; `param` names the form field or the content part."""


@dataclass(frozen=True, slots=True)
class Probe:
    container: str  # as the reader names it: WAV, FLAC, mp3, mov,mp4,m4a,3gp,3g2,mj2, ...
    seconds: float | None  # None: the header does not say


def probe(data: bytes) -> Probe:
    """What the bytes are, from their header alone; ValueError when no audio reader recognises them."""
    import soundfile

    if not data:
        raise ValueError("it is empty")
    try:
        info = soundfile.info(io.BytesIO(data))
    except Exception:  # soundfile's errors, and its own TypeErrors on odd headers: not one of its formats
        pass
    else:
        known = info.frames > 0 and info.samplerate > 0 and info.frames < 2**62
        return Probe(str(info.format), info.frames / info.samplerate if known else None)
    return _probe_ffmpeg(data)


def _probe_ffmpeg(data: bytes) -> Probe:
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise ValueError("it holds no audio stream")
            seconds = container.duration / av.time_base if container.duration else None
            return Probe(container.format.name, seconds)
    except av.FFmpegError:
        raise ValueError("it is not audio in a container this server reads (WAV, FLAC, OGG, MP3, MP4/M4A, WebM, ...), "
                         "or the file is damaged") from None


@dataclass(frozen=True, slots=True, eq=False)
class AudioPolicy:
    """The server's audio limits (CHOIR_MAX_AUDIO_BYTES, CHOIR_MAX_AUDIO_SECONDS, CHOIR_AUDIO_DECODES)."""

    max_bytes: int = 25 * 1024 * 1024  # OpenAI's and vLLM's 25 MB
    max_seconds: float = 600.0  # vLLM's VLLM_MAX_AUDIO_DECODE_DURATION_S
    decodes: int = 2
    _gate: asyncio.Semaphore = field(init=False, repr=False)
    _threads: ThreadPoolExecutor | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_gate", asyncio.Semaphore(self.decodes))

    def _payload(self, part: dict[str, Any], name: str) -> str:
        """An audio part's base64 data, once its form and size are acceptable."""
        if part["type"] == "input_audio":
            payload: str = part["input_audio"]["data"]
        else:
            head, comma, payload = part["audio_url"]["url"].partition(",")
            if head[:5].lower() != "data:" or not comma or not head.lower().endswith(";base64"):
                raise AudioRefused(400, "An audio URL is a data URL (data:audio/wav;base64,...): audio URLs are not "
                                        "fetched by this server.", name)
        if len(payload) * 3 // 4 > self.max_bytes + 2:
            raise self.too_large(name)
        return payload

    def close(self) -> None:
        """At the app's shutdown: its threads end (an app started again makes new ones)."""
        threads = self._threads
        object.__setattr__(self, "_threads", None)
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)

    def too_large(self, param: str) -> AudioRefused:
        return AudioRefused(400, f"The audio is larger than this server takes ({self.max_bytes} bytes, "
                                 "CHOIR_MAX_AUDIO_BYTES).", param)

    async def check(self, data: bytes, param: str) -> Probe:
        """The header's reading, or a 400 naming `param`: not audio, damaged, too large, too long."""
        if len(data) > self.max_bytes:
            raise self.too_large(param)
        try:
            found = await self.run(probe, data)
        except ValueError as exc:
            raise AudioRefused(400, f"The audio cannot be read: {exc}.", param) from None
        if found.seconds is not None and found.seconds > self.max_seconds:
            raise AudioRefused(400, f"The audio is {found.seconds:.1f} s long, longer than this server takes "
                                    f"({self.max_seconds:g} s, CHOIR_MAX_AUDIO_SECONDS).", param)
        return found

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` in one of the policy's threads, when one is free."""
        async with self._gate:
            threads = self._threads
            if threads is None:  # made on first use: an app that never decodes starts no thread
                threads = ThreadPoolExecutor(self.decodes, thread_name_prefix="choir-audio")
                object.__setattr__(self, "_threads", threads)
            return await asyncio.get_running_loop().run_in_executor(threads, work, *args)

    def refused(self, exc: ValueError, param: str) -> AudioRefused:
        """A decoder's refusal (vLLM's loader: too long once decoded, damaged data) as a 400 naming `param`."""
        reason = str(exc).rstrip(".")
        if "exceeds maximum allowed duration" in reason or "Audio exceeds" in reason:
            return AudioRefused(400, f"The audio is longer than this server takes ({self.max_seconds:g} s, "
                                     "CHOIR_MAX_AUDIO_SECONDS).", param)
        return AudioRefused(400, f"The audio cannot be decoded: {reason}.", param)

    async def prepare(self, messages: list[dict[str, Any]], max_audios: int,
                      names: Sequence[str] | None = None) -> list[str]:
        """Chat messages' audio parts checked before they are rendered, for a model that takes `max_audios` per
        prompt (each a 400 naming its part); their names. `names`: where each came from in another API's request
        (Responses'), in the messages' order."""
        parts = [(part, f"messages[{i}].content[{j}]") for i, message in enumerate(messages)
                 if isinstance(message.get("content"), list)
                 for j, part in enumerate(message["content"]) if part.get("type") in AUDIO_PARTS]
        if names is not None:
            parts = [(part, name) for (part, _), name in zip(parts, names, strict=True)]
        for index, (_, name) in enumerate(parts):
            if max_audios == 0:
                raise AudioRefused(400, HEARS_NOTHING, name)
            if index >= max_audios:
                raise AudioRefused(400, f"At most {max_audios} audio part(s) may be provided in one prompt (the "
                                        "engine's --limit-mm-per-prompt).", name)
        for part, name in parts:
            await self.check(await self.run(_b64decode, self._payload(part, name), name), name)
        return [name for _, name in parts]


def _b64decode(payload: str, name: str) -> bytes:
    """In a policy thread: base64 of megabytes takes milliseconds."""
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise AudioRefused(400, "The audio data is not valid base64.", name) from None
