"""WebSocket /v1/realtime over a fake engine whose model "transcribes streamed audio" (FakeRealtime: each waveform
is its sample count, written back as text): the session's events in vLLM's protocol, utterances one engine request
each and in order, every refused event an `error` event with vLLM's code after which the session goes on, the
audio limits, a model that cannot stream, a client that leaves, and the API key at the handshake. The real engine
(the tiny Qwen3-ASR realtime model): tests/integration/test_realtime.py."""

import asyncio
import base64
import json
import threading
import time
from typing import Any

import pytest
from litestar.exceptions import WebSocketDisconnect
from litestar.testing import TestClient
from structlog.testing import capture_logs

from choir.app.asgi import create_app
from choir.app.serving.realtime import WAITING_UTTERANCES
from choir.core.settings import Settings
from choir.engine.protocol import EngineDead, EngineRejected
from choir.engine.speech import Transcribed
from tests.fakes import FakeEngine, fake_engine_factory

PATH = "/v1/realtime"
RATE = 16000


class FakeRealtime:
    sample_rate = RATE

    def __init__(self, fail_with: BaseException | None = None) -> None:
        self.fail_with = fail_with
        self.gate: threading.Event | None = None  # when set here, each request waits for it before it reads audio
        self.requests: list[str] = []
        self.closed: list[str] = []

    def samples(self, pcm16: bytes) -> int:
        return len(pcm16) // 2

    async def transcribe(self, audio: Any, request_id: str) -> Any:
        self.requests.append(request_id)
        while self.gate is not None and not self.gate.is_set():
            await asyncio.sleep(0.005)
        try:
            total = 0
            async for count in audio:
                total += count
                if self.fail_with is not None:
                    raise self.fail_with
                yield Transcribed(f" {count}", 1, total // 1000)
            yield Transcribed(" end", 2, total // 1000)
        finally:
            self.closed.append(request_id)


def pcm(seconds: float) -> str:
    return base64.b64encode(bytes(int(seconds * RATE) * 2)).decode()


def make_client(realtime: Any = None, **settings: Any) -> TestClient:
    engine = FakeEngine(realtime=realtime)
    app = create_app(Settings(served_model_name="fake-model", store_url=None, **settings),
                     engine_factory=fake_engine_factory(engine))
    return TestClient(app)


@pytest.fixture
def realtime() -> FakeRealtime:
    return FakeRealtime()


@pytest.fixture
def client(realtime):
    with make_client(realtime) as client:
        yield client


def send(ws: Any, kind: str, **fields: Any) -> None:
    ws.send_text(json.dumps({"type": kind, **fields}))


def until_done(ws: Any) -> tuple[list[str], dict[str, Any]]:
    deltas = []
    while (event := ws.receive_json(timeout=10))["type"] == "transcription.delta":
        deltas.append(event["delta"])
    return deltas, event


def opened(ws: Any) -> None:
    created = ws.receive_json(timeout=10)
    assert created["type"] == "session.created" and created["id"].startswith("sess-")
    assert abs(created["created"] - time.time()) < 60
    send(ws, "session.update", model="fake-model")


def test_an_utterance_streams_its_transcript_and_ends_with_the_usage(client, realtime):
    with capture_logs() as logs:
        with client.websocket_connect(PATH) as ws:
            opened(ws)
            send(ws, "input_audio_buffer.append", audio=pcm(1))
            send(ws, "input_audio_buffer.commit")  # starts transcribing what came and what comes
            send(ws, "input_audio_buffer.append", audio=pcm(0.5), event_id="ev_1")  # a field it lacks: ignored
            send(ws, "input_audio_buffer.commit", final=True)
            deltas, done = until_done(ws)
        deadline = time.monotonic() + 10
        while not any(entry["event"] == "realtime session" for entry in logs) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert deltas == [" 16000", " 8000", " end"]
    assert done == {"type": "transcription.done", "text": " 16000 8000 end",
                    "usage": {"prompt_tokens": 24, "completion_tokens": 4, "total_tokens": 28}}
    assert len(realtime.requests) == 1 and realtime.requests[0].startswith("rt-")
    [line] = [entry for entry in logs if entry["event"] == "realtime session"]  # one line a session
    assert line["session"] == realtime.requests[0].rsplit("-", 1)[0] and line["utterances"] == 1
    assert (line["audio_seconds"], line["prompt_tokens"], line["completion_tokens"]) == (1.5, 24, 4)


def test_a_final_commit_alone_transcribes_and_utterances_come_back_in_order(client, realtime):
    with client.websocket_connect(PATH) as ws:
        opened(ws)
        for seconds in (1, 2):
            send(ws, "input_audio_buffer.append", audio=pcm(seconds))
            send(ws, "input_audio_buffer.commit", final=True)  # audio after it is the next utterance's
        first, second = until_done(ws)[1], until_done(ws)[1]
        send(ws, "input_audio_buffer.commit", final=True)  # nothing appended: an empty transcript
        empty = until_done(ws)[1]
    assert [first["text"], second["text"], empty["text"]] == [" 16000 end", " 32000 end", " end"]
    assert empty["usage"] == {"prompt_tokens": 0, "completion_tokens": 2, "total_tokens": 2}
    assert len(set(realtime.requests)) == 3


def test_a_session_holds_so_many_committed_utterances_and_refuses_the_next_final_commit(client, realtime):
    realtime.gate = threading.Event()  # the first utterance's request waits: the ones after it wait for it
    with client.websocket_connect(PATH) as ws:
        opened(ws)
        for _ in range(WAITING_UTTERANCES):
            send(ws, "input_audio_buffer.append", audio=pcm(1))
            send(ws, "input_audio_buffer.commit", final=True)
        send(ws, "input_audio_buffer.append", audio=pcm(2))
        send(ws, "input_audio_buffer.commit", final=True)
        error = ws.receive_json(timeout=10)
        assert error["type"] == "error" and error["code"] == "too_many_utterances", error
        assert error["error"].startswith(f"{WAITING_UTTERANCES} utterances are waiting")
        realtime.gate.set()
        texts = [until_done(ws)[1]["text"] for _ in range(WAITING_UTTERANCES)]
        send(ws, "input_audio_buffer.commit", final=True)  # the refused commit's audio stayed appended
        last = until_done(ws)[1]
    assert texts == [" 16000 end"] * WAITING_UTTERANCES and last["text"] == " 32000 end"
    assert len(set(realtime.requests)) == WAITING_UTTERANCES + 1


def test_large_chunks_are_decoded_off_the_event_loop_and_counted_the_same(client, realtime):
    with client.websocket_connect(PATH) as ws:
        opened(ws)
        send(ws, "input_audio_buffer.append", audio=pcm(12))  # 512 KB of base64
        send(ws, "input_audio_buffer.commit", final=True)
        assert until_done(ws)[1]["text"] == " 192000 end"


REFUSED = [
    ("not json", "invalid_json", "Invalid JSON"),
    ("[1, 2]", "unknown_event", "Unknown event type: None"),
    ('{"type": "response.create"}', "unknown_event", "Unknown event type: response.create (the events are"),
    ('{"type": "input_audio_buffer.append"}', "invalid_event", "missing required field `audio`"),
    ('{"type": "input_audio_buffer.append", "audio": 5}', "invalid_event", "Expected `str`, got `int`"),
    ('{"type": "input_audio_buffer.commit", "final": "yes"}', "invalid_event", "Expected `bool`"),
    ('{"type": "session.update"}', "invalid_event", "Missing required field: model"),
    ('{"type": "session.update", "model": "other"}', "model_not_found", "The model `other` does not exist."),
    ('{"type": "input_audio_buffer.append", "audio": "!!"}', "invalid_audio", "not valid base64"),
    ('{"type": "input_audio_buffer.append", "audio": ""}', "invalid_audio", "Can't process empty audio."),
    ('{"type": "input_audio_buffer.append", "audio": "AAAA"}', "invalid_audio", "two bytes a sample"),
]


@pytest.mark.parametrize(("message", "code", "says"), REFUSED, ids=[case[1] + str(i) for i, case in enumerate(REFUSED)])
def test_a_refused_event_is_an_error_event_and_the_session_goes_on(client, message, code, says):
    with client.websocket_connect(PATH) as ws:
        opened(ws)
        ws.send_text(message)
        error = ws.receive_json(timeout=10)
        assert error["type"] == "error" and error["code"] == code and says in error["error"], error
        send(ws, "input_audio_buffer.append", audio=pcm(1))
        send(ws, "input_audio_buffer.commit", final=True)
        assert until_done(ws)[1]["text"] == " 16000 end"


def test_a_binary_frame_is_refused(client):
    with client.websocket_connect(PATH) as ws:
        opened(ws)
        ws.send_bytes(b"\0\0")
        assert ws.receive_json(timeout=10)["code"] == "invalid_event"


def test_a_commit_before_the_model_is_named_is_refused(client, realtime):
    with client.websocket_connect(PATH) as ws:
        ws.receive_json(timeout=10)
        send(ws, "input_audio_buffer.append", audio=pcm(1))  # appends may come first, as on vLLM
        send(ws, "input_audio_buffer.commit")
        error = ws.receive_json(timeout=10)
        assert error["code"] == "model_not_validated" and "session.update" in error["error"]
        send(ws, "session.update", model="fake-model")
        send(ws, "input_audio_buffer.commit", final=True)
        assert until_done(ws)[1]["text"] == " 16000 end"
    assert len(realtime.requests) == 1


@pytest.mark.parametrize(("settings", "code", "says"), [
    ({"max_audio_bytes": 40_000}, "audio_too_large", "40000 bytes of audio, CHOIR_MAX_AUDIO_BYTES"),
    ({"max_audio_seconds": 2}, "audio_too_long", "2 s, CHOIR_MAX_AUDIO_SECONDS"),
])
def test_an_utterance_over_the_servers_audio_limits_is_refused_chunk_by_chunk(realtime, settings, code, says):
    with make_client(realtime, **settings) as client, client.websocket_connect(PATH) as ws:
        opened(ws)
        send(ws, "input_audio_buffer.append", audio=pcm(1))  # 32 000 bytes, 1 s
        send(ws, "input_audio_buffer.append", audio=pcm(1.5))  # over either limit: not taken
        error = ws.receive_json(timeout=10)
        assert error["code"] == code and says in error["error"] and "final: true" in error["error"]
        send(ws, "input_audio_buffer.commit", final=True)
        assert until_done(ws)[1]["text"] == " 16000 end"
        send(ws, "input_audio_buffer.append", audio=pcm(1))  # the next utterance starts from nothing
        send(ws, "input_audio_buffer.commit", final=True)
        assert until_done(ws)[1]["text"] == " 16000 end"


def test_a_model_that_cannot_stream_speech_says_so_and_closes():
    with make_client(None) as client, client.websocket_connect(PATH) as ws:
        error = ws.receive_json(timeout=10)
        assert error["code"] == "model_not_realtime" and "/v1/audio/transcriptions" in error["error"]
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=10)
    assert closed.value.code == 1008


def test_a_client_that_leaves_aborts_its_utterances(client, realtime):
    with client.websocket_connect(PATH) as ws:
        opened(ws)
        send(ws, "input_audio_buffer.append", audio=pcm(1))
        send(ws, "input_audio_buffer.commit")
        assert ws.receive_json(timeout=10) == {"type": "transcription.delta", "delta": " 16000"}
    deadline = time.monotonic() + 10
    while not realtime.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert realtime.closed == realtime.requests  # the engine's generator closed: vLLM aborts the request


def test_an_engine_refusal_is_an_error_event_and_a_dead_engine_closes_the_session():
    with make_client(FakeRealtime(EngineRejected("A segment of audio takes 3000 tokens.", "audio"))) as client, \
            client.websocket_connect(PATH) as ws:
        opened(ws)
        send(ws, "input_audio_buffer.append", audio=pcm(1))
        send(ws, "input_audio_buffer.commit", final=True)
        assert ws.receive_json(timeout=10) == {"type": "error", "error": "A segment of audio takes 3000 tokens.",
                                               "code": "invalid_audio"}
    with make_client(FakeRealtime(EngineDead("boom"))) as client, client.websocket_connect(PATH) as ws:
        opened(ws)
        send(ws, "input_audio_buffer.append", audio=pcm(1))
        send(ws, "input_audio_buffer.commit", final=True)
        assert ws.receive_json(timeout=10)["code"] == "engine_dead"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=10)
    assert closed.value.code == 1011


def test_an_unexpected_failure_is_a_processing_error_and_the_session_goes_on():
    with make_client(FakeRealtime(RuntimeError("secret detail"))) as client, client.websocket_connect(PATH) as ws:
        opened(ws)
        send(ws, "input_audio_buffer.append", audio=pcm(1))
        send(ws, "input_audio_buffer.commit", final=True)
        error = ws.receive_json(timeout=10)
        assert error["code"] == "processing_error" and "secret" not in error["error"]
        send(ws, "session.update", model="nope")
        assert ws.receive_json(timeout=10)["code"] == "model_not_found"


def test_with_api_keys_the_handshake_needs_one(realtime):
    with make_client(realtime, api_keys=("sk-1",)) as client:
        with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect(PATH) as ws:
            ws.receive_json(timeout=10)
        assert refused.value.code == 1008
        with client.websocket_connect(PATH, headers={"Authorization": "Bearer sk-1"}) as ws:
            opened(ws)
            send(ws, "input_audio_buffer.commit", final=True)
            assert until_done(ws)[1]["type"] == "transcription.done"


def test_the_session_runs_on_one_event_loop_with_other_requests(client):
    """A chat request between a session's events is answered while the session stays open."""
    with client.websocket_connect(PATH) as ws:
        opened(ws)
        answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200
        send(ws, "input_audio_buffer.commit", final=True)
        assert until_done(ws)[1]["text"] == " end"



def metric(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_sessions_are_counted_under_vllms_metric_names(client):
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    unregister_vllm_metrics()  # as a real engine's stat loggers do when they start in this process
    total, seconds = (metric(client, "vllm:websocket_connections_total"),
                      metric(client, "vllm:websocket_connection_duration_seconds_count"))
    with client.websocket_connect(PATH) as ws:
        opened(ws)
        assert metric(client, "vllm:websocket_connections_active") >= 1
        send(ws, "input_audio_buffer.commit", final=True)
        until_done(ws)
    deadline = time.monotonic() + 10
    while metric(client, "vllm:websocket_connection_duration_seconds_count") == seconds and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metric(client, "vllm:websocket_connections_total") == total + 1
    assert metric(client, "vllm:websocket_connection_duration_seconds_count") == seconds + 1
