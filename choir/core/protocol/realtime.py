"""/v1/realtime's events: vLLM's realtime transcription protocol (vllm/entrypoints/speech_to_text/realtime/
protocol.py), JSON in text frames. The client configures the session, appends base64 PCM16 (mono, the model's
sample rate: 16 kHz) and commits; the server streams the transcript back. Fields an event does not define are
ignored (OpenAI's clients send `event_id`)."""

import time
import uuid

import msgspec

from choir.core.protocol.common import Usage


class SessionUpdate(msgspec.Struct, kw_only=True):
    model: str | None = None


class AudioAppend(msgspec.Struct, kw_only=True):
    audio: str  # base64 of PCM16 little-endian samples


class AudioCommit(msgspec.Struct, kw_only=True):
    final: bool = False  # true: the audio has ended (the transcript is finished); false: start transcribing


CLIENT_EVENTS: dict[str, type[msgspec.Struct]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": AudioAppend,
    "input_audio_buffer.commit": AudioCommit,
}


class SessionCreated(msgspec.Struct, tag="session.created", tag_field="type"):
    id: str = msgspec.field(default_factory=lambda: f"sess-{uuid.uuid4().hex}")
    created: int = msgspec.field(default_factory=lambda: int(time.time()))


class TranscriptionDelta(msgspec.Struct, tag="transcription.delta", tag_field="type"):
    delta: str


class TranscriptionDone(msgspec.Struct, tag="transcription.done", tag_field="type"):
    text: str
    usage: Usage


class ErrorEvent(msgspec.Struct, tag="error", tag_field="type"):
    """Sent for an event the server refuses; the session stays open unless it cannot go on."""

    error: str
    code: str


ServerEvent = SessionCreated | TranscriptionDelta | TranscriptionDone | ErrorEvent
