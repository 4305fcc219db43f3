"""/v1/realtime: one websocket session of vLLM's realtime transcription protocol (choir/core/protocol/realtime.py).

The client names the model (`session.update`), appends base64 PCM16 (`input_audio_buffer.append`) and commits:
`commit` starts transcribing what it has appended and will append, `commit` with `final: true` says the audio has
ended; the server answers `transcription.delta` as the model writes and `transcription.done` with the usage. One
utterance is one engine request (the model's own segments feed it as they fill); audio appended after a final
commit is the next utterance's, transcribed after this one. A refused event is an `error` event with vLLM's code
and the session goes on: each append is checked (base64, whole samples, not empty) and so is each utterance's
size against the server's audio limits (CHOIR_MAX_AUDIO_BYTES, CHOIR_MAX_AUDIO_SECONDS), and a final commit
against the utterances still in memory (WAITING_UTTERANCES). A client that leaves aborts its requests.
"""

import asyncio
import base64
import binascii
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog
from litestar import WebSocket
from litestar.exceptions import WebSocketDisconnect
from litestar.status_codes import WS_1008_POLICY_VIOLATION, WS_1011_INTERNAL_ERROR

from choir.core.protocol.common import Usage
from choir.core.protocol.realtime import (
    CLIENT_EVENTS,
    AudioAppend,
    AudioCommit,
    ErrorEvent,
    ServerEvent,
    SessionCreated,
    SessionUpdate,
    TranscriptionDelta,
    TranscriptionDone,
)
from choir.engine.protocol import Engine, EngineDead, EngineRejected
from choir.engine.speech import Realtime
from choir.plugins.audio import AudioPolicy
from choir.plugins.metrics import WEBSOCKET_SECONDS, WEBSOCKETS, WEBSOCKETS_ACTIVE

log = structlog.get_logger("choir.realtime")
NOT_REALTIME = ("The served model does not transcribe streamed audio: serve a realtime speech model (Qwen3-ASR, "
                "Voxtral realtime) for /v1/realtime, or send whole files to /v1/audio/transcriptions "
                "(docs/api/audio.md).")
THREAD_BYTES = 256 * 1024  # base64 this long is decoded in the audio policy's threads, not on the event loop
# Utterances a session may have committed and not yet transcribed (each holds its audio, up to the limits): with the
# open one, a session holds at most five utterances' audio, however fast a client commits.
WAITING_UTTERANCES = 4
_encoder = msgspec.json.Encoder()


class Refused(Exception):
    """An event the session refuses: sent back as an `error` event."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message, self.code = message, code


@dataclass(eq=False)
class Utterance:
    """The audio between two final commits: one engine request once committed."""

    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)  # waveforms, then None: the audio ended
    bytes: int = 0
    started: bool = False

    async def waveforms(self) -> AsyncGenerator[Any, None]:
        while (waveform := await self.queue.get()) is not None:
            yield waveform


class RealtimeSession:
    def __init__(self, socket: WebSocket, engine: Engine, policy: AudioPolicy) -> None:
        self._socket, self._engine, self._policy = socket, engine, policy
        self._realtime: Realtime | None = engine.realtime
        self._model: str | None = None
        self._utterance = Utterance()
        self._turns: list[asyncio.Task[None]] = []  # unfinished utterances', in order: each waits for the one before
        self._count = 0  # utterances begun, for their request ids
        self._sending = asyncio.Lock()
        self._id = f"rt-{uuid.uuid4().hex}"
        self._done: Counter[str] = Counter()  # what the transcribed utterances came to, for the log

    async def run(self) -> None:
        socket = self._socket
        await socket.accept()
        began = time.monotonic()
        WEBSOCKETS.inc()
        WEBSOCKETS_ACTIVE.inc()
        try:
            await self._serve()
        finally:
            WEBSOCKETS_ACTIVE.dec()
            seconds = time.monotonic() - began
            WEBSOCKET_SECONDS.observe(seconds)
            rate = self._realtime.sample_rate if self._realtime is not None else 1
            done = self._done
            log.info("realtime session", session=self._id, seconds=round(seconds, 3), utterances=done["utterances"],
                     audio_seconds=round(done["bytes"] / 2 / rate, 3), prompt_tokens=done["prompt_tokens"],
                     completion_tokens=done["completion_tokens"])

    async def _serve(self) -> None:
        socket = self._socket
        if self._realtime is None:
            await self._send(ErrorEvent(NOT_REALTIME, "model_not_realtime"))
            await socket.close(WS_1008_POLICY_VIOLATION, "not a realtime model")
            return
        await self._send(SessionCreated())
        try:
            while True:
                message = await socket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text: str | None = message.get("text")  # type: ignore[assignment]
                try:
                    if text is None:
                        raise Refused("Events are JSON in text frames, not binary ones.", "invalid_event")
                    await self._handle(text)
                except Refused as refused:
                    await self._send(ErrorEvent(refused.message, refused.code))
        except WebSocketDisconnect:
            pass
        finally:
            await self._close()

    async def _handle(self, text: str) -> None:
        try:
            raw = msgspec.json.decode(text)
        except msgspec.DecodeError:
            raise Refused("Invalid JSON", "invalid_json") from None
        kind = raw.get("type") if isinstance(raw, dict) else None
        event_type = CLIENT_EVENTS.get(kind) if isinstance(kind, str) else None
        if event_type is None:
            known = ", ".join(CLIENT_EVENTS)
            raise Refused(f"Unknown event type: {kind} (the events are {known}).", "unknown_event")
        try:
            event = msgspec.convert(raw, event_type)
        except msgspec.ValidationError as exc:
            raise Refused(f"The `{kind}` event is invalid: {exc}.", "invalid_event") from None
        if isinstance(event, SessionUpdate):
            self._update(event)
        elif isinstance(event, AudioAppend):
            await self._append(event)
        else:
            assert isinstance(event, AudioCommit)
            self._commit(event)

    def _update(self, event: SessionUpdate) -> None:
        if event.model is None:
            raise Refused("Missing required field: model", "invalid_event")
        if event.model not in self._engine.served_model_names:
            raise Refused(f"The model `{event.model}` does not exist.", "model_not_found")
        self._model = event.model

    async def _append(self, event: AudioAppend) -> None:
        assert self._realtime is not None
        if len(event.audio) > THREAD_BYTES:
            data = await self._policy.run(_b64decode, event.audio)
        else:
            data = _b64decode(event.audio)
        if not data:
            raise Refused("Can't process empty audio.", "invalid_audio")
        if len(data) % 2:
            raise Refused("The audio is PCM16, two bytes a sample: this chunk has an odd length.", "invalid_audio")
        policy, utterance = self._policy, self._utterance
        if utterance.bytes + len(data) > policy.max_bytes:
            raise Refused(f"The utterance is larger than this server takes ({policy.max_bytes} bytes of audio, "
                          "CHOIR_MAX_AUDIO_BYTES): commit it with final: true and go on in the next.",
                          "audio_too_large")
        seconds = (utterance.bytes + len(data)) / 2 / self._realtime.sample_rate
        if seconds > policy.max_seconds:
            raise Refused(f"The utterance is longer than this server takes ({policy.max_seconds:g} s, "
                          "CHOIR_MAX_AUDIO_SECONDS): commit it with final: true and go on in the next.",
                          "audio_too_long")
        utterance.bytes += len(data)
        utterance.queue.put_nowait(self._realtime.samples(data))

    def _commit(self, event: AudioCommit) -> None:
        if self._model is None:
            raise Refused("Model not validated. Make sure to validate the model by sending a session.update event.",
                          "model_not_validated")
        utterance = self._utterance
        self._turns = [turn for turn in self._turns if not turn.done()]
        if event.final and len(self._turns) + (not utterance.started) > WAITING_UTTERANCES:
            raise Refused(f"{WAITING_UTTERANCES} utterances are waiting to be transcribed: commit this one with "
                          "final: true after the next transcription.done (its audio stays appended).",
                          "too_many_utterances")
        if not utterance.started:
            utterance.started = True
            previous = self._turns[-1] if self._turns else None
            request_id = f"{self._id}-{self._count}"
            self._count += 1
            self._turns.append(asyncio.create_task(self._transcribe(utterance, previous, request_id)))
        if event.final:
            utterance.queue.put_nowait(None)
            self._utterance = Utterance()

    async def _transcribe(self, utterance: Utterance, previous: asyncio.Task[None] | None, request_id: str) -> None:
        assert self._realtime is not None
        if previous is not None:
            await asyncio.wait([previous])
        text: list[str] = []
        prompt_tokens = completion_tokens = 0
        try:
            async with contextlib.aclosing(self._realtime.transcribe(utterance.waveforms(), request_id)) as steps:
                async for step in steps:
                    prompt_tokens = max(prompt_tokens, step.prompt_tokens)
                    completion_tokens += step.tokens
                    if step.text:
                        text.append(step.text)
                        await self._send(TranscriptionDelta(step.text))
            usage = Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)
            await self._send(TranscriptionDone("".join(text), usage))
            self._done.update(utterances=1, bytes=utterance.bytes, prompt_tokens=prompt_tokens,
                              completion_tokens=completion_tokens)
        except EngineRejected as exc:
            await self._send(ErrorEvent(exc.message, "invalid_audio"))
        except EngineDead:
            await self._send(ErrorEvent("The engine has stopped: this server cannot transcribe any more.",
                                        "engine_dead"))
            await self._socket.close(WS_1011_INTERNAL_ERROR, "engine dead")
        except Exception:
            log.exception("realtime transcription failed", request_id=request_id)
            await self._send(ErrorEvent("The transcription failed on the server.", "processing_error"))

    async def _send(self, event: ServerEvent) -> None:
        async with self._sending:
            # The client has gone: nobody reads it.
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await self._socket.send_data(_encoder.encode(event).decode(), mode="text")

    async def _close(self) -> None:
        """The client has gone (or the server is stopping): every utterance's request aborted."""
        for turn in self._turns:
            turn.cancel()
        if self._turns:
            await asyncio.wait(self._turns)


def _b64decode(payload: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise Refused("The audio is not valid base64.", "invalid_audio") from None
