"""SIGTERM during in-flight streams: short ones finish, those still running at the drain timeout
(CHOIR_DRAIN_SECONDS) end with one error event and [DONE]; the server exits, leaving no process."""

import signal
import threading
import time

import httpx
import pytest

from tests.integration.server import start_server
from tests.sse import sse_json

pytestmark = pytest.mark.engine


def test_sigterm_drains_then_stops_what_is_left(tmp_path):
    server = start_server(tmp_path / "server.log", env={"CHOIR_DRAIN_SECONDS": "2"})
    results: dict[str, httpx.Response] = {}

    def stream(name: str, max_tokens: int) -> None:
        results[name] = httpx.post(f"{server.base_url}/v1/completions", timeout=120, json={
            "prompt": "a story", "n": 2, "max_tokens": max_tokens, "ignore_eos": True, "stream": True})

    threads = [threading.Thread(target=stream, args=(f"long{i}", 1800)) for i in range(2)]
    threads.append(threading.Thread(target=stream, args=("short", 60)))
    try:
        for thread in threads:
            thread.start()
        server.wait_for_unfinished(6)
        assert httpx.get(f"{server.base_url}/load").json()["server_load"] == 6  # n = 2, three requests
        assert httpx.get(f"{server.base_url}/ready").json() == {"status": "ready"}
        signaled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        try:  # draining: not ready (uvicorn has closed the listener, or the app says 503)
            assert httpx.get(f"{server.base_url}/ready", timeout=5).status_code == 503
        except httpx.TransportError:
            pass
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
        short, _ = sse_json(results["short"].text)
        assert not any("error" in event for event in short)
        assert sum(1 for e in short if e["choices"] and e["choices"][0]["finish_reason"] == "length") == 2
        for name in ("long0", "long1"):
            events, done = sse_json(results[name].text)
            assert done == 1 and events[-1]["error"]["code"] == 503, events[-1]
            assert "shutting down" in events[-1]["error"]["message"]
        server.process.wait(60)
        assert time.monotonic() - signaled < 30
    finally:
        server.stop()  # asserts that no process is left behind
