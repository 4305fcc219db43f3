"""Streamed speech to text on the real engine: the tiny Qwen3-ASR realtime model (models/choir-tiny-realtime, vLLM's
own Qwen3-ASR realtime code, buffering and processor) behind Choir, over /v1/realtime with a websocket client and
with the OpenAI SDK's realtime client: a transcript as it is written, the same for the same audio (greedy), audio
past the model's context (which kills vLLM 0.32's own engine) cut into requests that fit, the API key at the
handshake; the same model's /v1/audio/transcriptions; the text model's server says it cannot stream speech."""

import base64
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from choir.core.settings import BUNDLED_REALTIME_DIR
from tests.audio_files import wav
from tests.integration.server import start_server

pytestmark = pytest.mark.engine

MODEL = "choir-tiny-realtime"
KEY = "sk-realtime"
DOCS = Path(__file__).resolve().parents[2] / "docs"
SEGMENT_TOKENS = 83  # a full 5 s segment's prompt: the chat markup and 65 audio tokens (13 a second)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("realtime") / "server.log",
                          env={"CHOIR_MODEL": str(BUNDLED_REALTIME_DIR), "CHOIR_API_KEY": KEY})
    yield server
    server.stop()


def url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/v1/realtime"


def tone(seconds: float) -> str:
    samples = (np.sin(np.arange(int(seconds * 16000)) / 7) * 8000).astype("<i2")
    return base64.b64encode(samples.tobytes()).decode()


def transcribe(base_url: str, seconds: int, commit_first: bool = True) -> tuple[list[str], dict[str, Any]]:
    """One session: `seconds` of a tone in 1 s appends; the deltas and the done event."""
    with connect(url(base_url), additional_headers={"Authorization": f"Bearer {KEY}"}, max_size=None) as ws:
        assert json.loads(ws.recv(timeout=60))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "model": MODEL}))
        if commit_first:
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        for _ in range(seconds):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": tone(1)}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        deltas = []
        while (event := json.loads(ws.recv(timeout=120)))["type"] == "transcription.delta":
            deltas.append(event["delta"])
    assert event["type"] == "transcription.done", event
    return deltas, event


def metric(base_url: str, name: str) -> float:
    """The sum of a metric's series (its labels ignored)."""
    metrics = httpx.get(f"{base_url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return sum(sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
               if sample.name == name)


def finished_requests(base_url: str) -> float:
    return metric(base_url, "vllm:request_success_total")


def test_a_session_streams_the_transcript_and_the_same_audio_gives_the_same_text(served):
    deltas, done = transcribe(served.base_url, 7)
    assert done["text"] == "".join(deltas) and done["text"].strip()
    # 7 s: a 5 s segment and the 2 s left at the final commit, each transcribed up to the model's 64 tokens
    assert done["usage"]["completion_tokens"] == 128
    assert SEGMENT_TOKENS < done["usage"]["prompt_tokens"] < 2 * SEGMENT_TOKENS
    assert done["usage"]["total_tokens"] == done["usage"]["prompt_tokens"] + 128
    again = transcribe(served.base_url, 7, commit_first=False)[1]  # a final commit alone transcribes too
    assert again == done


def test_sessions_are_counted_beside_the_engines_metrics(served):
    """The engine's stat loggers unregister every "vllm:" collector when they start, the websocket ones too."""
    before = metric(served.base_url, "vllm:websocket_connections_total")
    ended = metric(served.base_url, "vllm:websocket_connection_duration_seconds_count")
    transcribe(served.base_url, 1)
    assert metric(served.base_url, "vllm:websocket_connections_total") == before + 1
    deadline = time.monotonic() + 10  # a session's length is observed when the server closes its side
    while metric(served.base_url, "vllm:websocket_connection_duration_seconds_count") == ended:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert finished_requests(served.base_url) >= 1


def test_audio_past_the_models_context_is_cut_into_requests_that_fit(served):
    before = finished_requests(served.base_url)
    done = transcribe(served.base_url, 100)[1]
    # 20 segments of 83 prompt tokens and 64 written: 2940 tokens, past the 2048 of --max-model-len
    assert done["usage"] == {"prompt_tokens": 20 * SEGMENT_TOKENS, "completion_tokens": 20 * 64,
                             "total_tokens": 20 * (SEGMENT_TOKENS + 64)}
    assert finished_requests(served.base_url) - before == 2
    assert httpx.get(f"{served.base_url}/health").status_code == 200
    assert transcribe(served.base_url, 2)[1]["usage"]["completion_tokens"] == 64


def test_the_openai_sdks_realtime_client_speaks_to_it(served):
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=KEY, max_retries=0)
    with client.realtime.connect(model=MODEL) as connection:
        assert connection.recv().type == "session.created"
        connection.send({"type": "session.update", "model": MODEL})  # type: ignore[arg-type,misc]
        connection.send({"type": "input_audio_buffer.append", "audio": tone(3)})
        connection.send({"type": "input_audio_buffer.commit", "final": True})  # type: ignore[typeddict-unknown-key]
        while (event := json.loads(connection.recv_bytes()))["type"] == "transcription.delta":
            pass
    assert event["type"] == "transcription.done" and event["usage"]["completion_tokens"] == 64


def test_without_the_key_the_handshake_is_a_401_in_openais_shape(served):
    with pytest.raises(InvalidStatus) as refused:
        connect(url(served.base_url), open_timeout=30)
    response = refused.value.response
    assert response.status_code == 401
    assert json.loads(response.body)["error"]["message"].startswith("Missing API key")


def test_the_same_model_transcribes_whole_files(served):
    sdk = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    answer = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", wav(3)))
    assert answer.text.strip() and answer.usage.type == "duration" and answer.usage.seconds == 3


def test_the_docs_example_runs(served, capsys):
    blocks = re.findall(r"^```python\n(.*?)^```", (DOCS / "api" / "audio.md").read_text(), re.M | re.S)
    (block,) = [block for block in blocks if "/v1/realtime" in block]
    local = 'connect("ws://127.0.0.1:8000/v1/realtime")'
    assert local in block
    keyed = f'connect("{url(served.base_url)}", additional_headers={{"Authorization": "Bearer {KEY}"}})'
    block = block.replace(local, keyed)
    exec(compile(block, "audio.md realtime example", "exec"), {})
    out = capsys.readouterr().out
    assert "'type': 'session.created'" in out and "'type': 'transcription.done'" in out


def test_the_text_models_server_says_it_cannot_stream_speech(server):
    with connect(url(server.base_url), open_timeout=30) as ws:
        error = json.loads(ws.recv(timeout=30))
        assert error["type"] == "error" and error["code"] == "model_not_realtime"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
