"""Kill the EngineCore under load: in-flight streams end with one error event and [DONE], /health turns
503, new requests get 503 in the OpenAI error shape, nothing hangs; SIGTERM then stops the server."""

import time

import httpx
import psutil
import pytest

from tests.integration.server import Streams, start_server
from tests.sse import sse_json

pytestmark = pytest.mark.engine


def test_engine_death_ends_every_request_cleanly(tmp_path):
    server = start_server(tmp_path / "server.log")
    try:
        [engine_core] = [p for p in server.descendants() if "EngineCore" in " ".join(p.cmdline()) or
                         p.name().startswith("VLLM::EngineCor")]
        streams = Streams(server.base_url, {"prompt": "long story", "n": 2, "max_tokens": 1500, "ignore_eos": True}, 3)
        server.wait_for_unfinished(6)
        time.sleep(0.5)  # past prefill: the streams are decoding (1500 tokens take seconds more)
        engine_core.kill()
        results = streams.join()  # no stream hangs
        started = 0
        for response in results:
            if response.status_code == 200:  # the stream had started: one error event, then [DONE]
                started += 1
                events, done = sse_json(response.text)
                assert done == 1 and "error" in events[-1] and events[-1]["error"]["code"] == 503
            else:  # the engine died before this stream's first output: a plain 503
                assert response.status_code == 503 and response.json()["error"]["code"] == 503
        assert started >= 1

        deadline = time.monotonic() + 10
        while httpx.get(f"{server.base_url}/health").status_code != 503:
            assert time.monotonic() < deadline, "health did not turn 503"
            time.sleep(0.1)
        for probe in ("/ready", "/ping"):  # neither ready nor alive: an orchestrator restarts it
            assert httpx.get(f"{server.base_url}{probe}").status_code == 503
        for body in ({"prompt": "x", "max_tokens": 2}, {"prompt": "x", "max_tokens": 2, "stream": True}):
            response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
            assert response.status_code == 503
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    finally:
        code = server.stop()  # asserts that no process is left behind
    assert code is not None
    assert not psutil.pid_exists(engine_core.pid) or psutil.Process(engine_core.pid).status() == "zombie"
