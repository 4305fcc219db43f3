"""vLLM's development routes and KV-event sources on the real engine (CPU build): caches reset, generation paused
and resumed, a method run on every worker, the server's configuration; what this engine cannot do (sleep, a
profiler) is a 400 saying why; /kv_event_sources says where the engine publishes its KV-cache events."""

import json

import httpx
import pytest

from tests.integration.server import free_port, start_server

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}"}
    server = start_server(tmp_path_factory.mktemp("operator") / "server.log", {
        "CHOIR_DEV_MODE": "true", "CHOIR_ENGINE_ARGS": f"--kv-events-config '{json.dumps(events)}'"})
    yield server
    server.stop()


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", timeout=60, **kwargs)


def get(server, path: str) -> httpx.Response:
    return httpx.get(f"{server.base_url}{path}", timeout=60)


def complete(server) -> httpx.Response:
    return post(server, "/v1/completions", json={"prompt": "Hello", "max_tokens": 4})


def test_reset_the_caches(server):
    assert complete(server).status_code == 200
    assert post(server, "/reset_prefix_cache").json() == {"success": True}
    assert post(server, "/reset_mm_cache").status_code == 200
    assert complete(server).status_code == 200


def test_pause_then_resume(server):
    assert post(server, "/pause", params={"mode": "wait"}).json() == {"status": "paused"}
    assert get(server, "/is_paused").json() == {"is_paused": True}
    assert post(server, "/resume").json() == {"status": "resumed"}
    assert get(server, "/is_paused").json() == {"is_paused": False}
    assert complete(server).status_code == 200


def test_what_the_cpu_engine_cannot_do_is_a_400(server):
    for path in ("/sleep", "/wake_up", "/start_profile"):
        answer = post(server, path)
        assert answer.status_code == 400, (path, answer.text)
        assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
    assert "--enable-sleep-mode" in post(server, "/sleep").json()["error"]["message"]
    assert get(server, "/is_sleeping").json() == {"is_sleeping": False}


def test_collective_rpc_runs_on_the_workers(server):
    answer = post(server, "/collective_rpc", json={"method": "check_health"})
    assert answer.status_code == 200 and answer.json() == {"results": [None]}
    assert post(server, "/collective_rpc", json={"method": ""}).status_code == 400


def test_server_info(server):
    text = get(server, "/server_info").json()
    assert "choir-tiny" in text["vllm_config"] and text["vllm_env"]["VLLM_HOST_IP"] == "127.0.0.1"
    assert isinstance(get(server, "/server_info?config_format=json").json()["vllm_config"], dict)


def test_kv_event_sources_name_the_engines_publisher(server):
    sources = get(server, "/kv_event_sources").json()
    assert list(sources) == ["0"] and sources["0"]["enable_kv_cache_events"] is True
    assert sources["0"]["endpoint"].startswith("tcp://127.0.0.1:")
