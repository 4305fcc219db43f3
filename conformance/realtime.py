"""Choir's and vLLM's /v1/realtime side by side: streamed speech to text over a websocket.

Starts Choir and then vLLM's own OpenAI server (one at a time: two CPU engines) on the bundled tiny streaming speech
model (models/choir-tiny-realtime: Qwen3-ASR realtime, 5 s segments) with the same engine flags (Choir's), opens one
session per case on each, sends the same events and prints one Markdown table of what came back: for a transcript
the deltas, the text's start and the usage; for a refused event the `error` event's code and message; how the
session ended.

    .venv/bin/python -m conformance.realtime [--out FILE]
"""

import base64
import hashlib
import json
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from choir.core.settings import BUNDLED_REALTIME_DIR, Settings
from conformance import side_by_side
from conformance.images import quoted
from tests.integration.server import Server, start_server, start_vllm_server

MODEL = "choir-tiny-realtime"
WAIT = 30  # seconds for an answer before the case says there was none
UPDATE = {"type": "session.update", "model": MODEL}
COMMIT, FINAL = {"type": "input_audio_buffer.commit"}, {"type": "input_audio_buffer.commit", "final": True}


def append(seconds: float) -> dict[str, Any]:
    """A tone at 16 kHz, PCM16."""
    import numpy as np

    samples = (np.sin(np.arange(int(seconds * 16000)) / 7) * 8000).astype("<i2")
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(samples.tobytes()).decode()}


def appends(seconds: int) -> list[dict[str, Any]]:
    return [append(1) for _ in range(seconds)]


# (name, what is sent, the frames in order (a dict is sent as JSON, a str or bytes as is), answers awaited:
# "done" until transcription.done, else the number of events)
CASES: list[tuple[str, str, list[Any], str | int]] = [
    ("utterance", "7 s in 1 s appends after a commit, then a final commit", [UPDATE, COMMIT, *appends(7), FINAL],
     "done"),
    ("final-only", "3 s, then only a final commit", [UPDATE, *appends(3), FINAL], "done"),
    ("again", "the utterance again (greedy: the same text)", [UPDATE, COMMIT, *appends(7), FINAL], "done"),
    ("bad-json", "`not json`", ["not json"], 1),
    ("unknown-type", '`{"type": "response.create"}`', [{"type": "response.create"}], 1),
    ("no-audio", "an append without `audio`", [{"type": "input_audio_buffer.append"}], 1),
    ("bad-base64", '`"audio": "!!"`', [{"type": "input_audio_buffer.append", "audio": "!!"}], 1),
    ("empty", '`"audio": ""`', [{"type": "input_audio_buffer.append", "audio": ""}], 1),
    ("odd-bytes", "3 bytes of PCM16", [{"type": "input_audio_buffer.append", "audio": "AAAA"}], 1),
    ("binary", "a binary frame", [b"\0\0"], 1),
    ("no-model", "`session.update` without `model`", [{"type": "session.update"}], 1),
    ("unknown-model", "`session.update` for `no-such-model`", [{"type": "session.update", "model": "no-such-model"}],
     1),
    ("not-validated", "a commit before `session.update`", [COMMIT], 1),
    ("long", "100 s (20 segments: past the model's 2048-token context)", [UPDATE, COMMIT, *appends(100), FINAL],
     "done"),
    ("after", "the utterance again, after all the above", [UPDATE, COMMIT, *appends(7), FINAL], "done"),
]


def settings() -> Settings:
    return Settings(model=str(BUNDLED_REALTIME_DIR), served_model_name=MODEL)


def engine_flags() -> list[str]:
    from vllm.platforms import current_platform

    from choir.engine.vllm.args import engine_argv

    return engine_argv(settings(), on_cpu=current_platform.is_cpu())


def start_vllm(log: Any) -> Server:
    return start_vllm_server(log, engine_flags())


def start_choir(log: Any) -> Server:
    return start_server(log, env={"CHOIR_MODEL": str(BUNDLED_REALTIME_DIR), "CHOIR_STORE": "off",
                                  "CHOIR_LOG_LEVEL": "warning", "VLLM_CPU_KVCACHE_SPACE": "1"})


def session(base_url: str, frames: list[Any], awaited: str | int) -> list[str]:
    """The case's facts: what the server sent after `session.created`, and how the session ended."""
    url = base_url.replace("http://", "ws://") + "/v1/realtime"
    events: list[dict[str, Any]] = []
    ended = "open"
    try:
        with connect(url, max_size=None, open_timeout=WAIT) as ws:
            created = json.loads(ws.recv(timeout=WAIT))
            for frame in frames:
                ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
            while (awaited == "done" and not any(e["type"] in ("transcription.done", "error") for e in events)) \
                    or (isinstance(awaited, int) and len(events) < awaited):
                events.append(json.loads(ws.recv(timeout=WAIT)))
    except TimeoutError:
        ended = f"open, nothing more in {WAIT} s"
    except ConnectionClosed as exc:
        ended = f"closed ({exc.rcvd.code if exc.rcvd else 'no close frame'})"
    except InvalidStatus as exc:
        return [f"handshake **{exc.response.status_code}**"]
    except OSError as exc:
        return [f"**no connection** ({type(exc).__name__})"]
    facts = [f"`{created['type']}`"] if created.get("type") != "session.created" else []
    deltas = [e for e in events if e["type"] == "transcription.delta"]
    if deltas:
        facts.append(f"{len(deltas)} deltas")
    for event in events:
        if event["type"] == "transcription.done":
            digest = hashlib.sha256(event["text"].encode()).hexdigest()[:8]
            facts.append(f"done: text {quoted(event['text'], 30)} ({len(event['text'])} chars, sha256 {digest})")
            facts.append("usage " + quoted(json.dumps(event.get("usage")), 90))
        elif event["type"] == "error":
            facts.append(f"error `{event.get('code')}`: {quoted(event.get('error', ''), 90)}")
    return [*facts, f"session {ended}"]


def run_cases(server: Server) -> dict[str, str]:
    results = {name: "<br>".join(session(server.base_url, frames, awaited)) for name, _, frames, awaited in CASES}
    try:
        health = str(httpx.get(f"{server.base_url}/health", timeout=10).status_code)
    except httpx.HTTPError as exc:
        health = f"no answer ({type(exc).__name__})"
    results[CASES[-1][0]] += f"<br>/health {health}"
    return results


def main() -> None:
    out = side_by_side.out_path(__doc__.splitlines()[0])
    results, seconds = side_by_side.compare("realtime", start_choir, start_vllm, run_cases)
    lines = side_by_side.table(CASES, results)
    lines += ["", f"Every session on model {MODEL}; audio is a 16 kHz tone. Both on the bundled tiny Qwen3-ASR "
              f"realtime model with `{' '.join(engine_flags()[2:])}`; {seconds:.0f} s in all."]
    side_by_side.publish(lines, out)


if __name__ == "__main__":
    main()
