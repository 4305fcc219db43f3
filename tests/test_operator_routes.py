"""vLLM's development routes (choir/app/routes/operator.py): off (404 naming the setting) unless CHOIR_DEV_MODE or
vLLM's VLLM_SERVER_DEV_MODE; then each reaches every engine as vLLM's server calls its engine, and what the engine
cannot do is a 400 naming why. /kv_event_sources is always served."""

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from tests.fakes import FakeEngine, fake_engine_factory
from tests.test_errors import error_of

ROUTES = [("POST", "/reset_prefix_cache"), ("POST", "/reset_mm_cache"), ("POST", "/pause"), ("POST", "/resume"),
          ("GET", "/is_paused"), ("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping"),
          ("POST", "/start_profile"), ("POST", "/stop_profile"), ("POST", "/collective_rpc"), ("GET", "/server_info")]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def dev(engine):
    app = create_app(Settings(served_model_name="fake-model", dev_mode=True),
                     engine_factory=fake_engine_factory(engine))
    with TestClient(app) as client:
        yield client


@pytest.mark.parametrize("method, path", ROUTES)
def test_off_unless_development_mode(client, method, path):
    message = error_of(client.request(method, path, json={"method": "x"}), 404)
    assert path in message and "CHOIR_DEV_MODE=true" in message and "VLLM_SERVER_DEV_MODE=1" in message


def test_vllms_variable_turns_it_on_too(tmp_path):
    assert Settings.from_env({"VLLM_SERVER_DEV_MODE": "1"}, tmp_path / "none").dev_mode
    assert not Settings.from_env({"VLLM_SERVER_DEV_MODE": "1", "CHOIR_DEV_MODE": "false"}, tmp_path / "none").dev_mode


def test_kv_event_sources_are_served_without_development_mode(client):
    answer = client.get("/kv_event_sources")
    assert answer.status_code == 200 and answer.json() == {}


def test_reset_prefix_cache_says_whether_it_could(dev, engine):
    assert dev.post("/reset_prefix_cache").json() == {"success": True}
    engine.prefix_cache_busy = True
    assert dev.post("/reset_prefix_cache").json() == {"success": False}
    assert dev.post("/reset_prefix_cache?reset_running_requests=true&reset_external=true").json() == {"success": True}
    assert engine.operations[-1] == ("reset_prefix_cache", (True, True))
    answer = dev.post("/reset_mm_cache")
    assert answer.status_code == 200 and answer.content == b"" and engine.operations[-1] == ("reset_mm_cache", None)


def test_pause_and_resume(dev, engine):
    assert dev.get("/is_paused").json() == {"is_paused": False}
    assert dev.post("/pause?mode=keep&clear_cache=false").json() == {"status": "paused"}
    assert engine.operations[-1] == ("pause", ("keep", False)) and dev.get("/is_paused").json() == {"is_paused": True}
    assert dev.post("/resume").json() == {"status": "resumed"} and dev.get("/is_paused").json() == {"is_paused": False}
    error_of(dev.post("/pause?mode=later"), 400, "mode")


def test_sleep_needs_sleep_mode(dev, engine):
    assert "--enable-sleep-mode" in error_of(dev.post("/sleep"), 400)
    engine.sleep_mode = True
    assert dev.post("/sleep?level=2").json() == {"status": "sleeping", "level": 2}
    assert dev.get("/is_sleeping").json() == {"is_sleeping": True}
    assert dev.post("/wake_up?tags=kv_cache").json() == {"status": "sleeping", "tags": ["kv_cache"]}
    assert dev.post("/wake_up").json() == {"status": "awake", "tags": None}
    assert dev.get("/is_sleeping").json() == {"is_sleeping": False}
    error_of(dev.post("/sleep?level=5"), 400, "level")


def test_the_profiler_needs_a_profiler(dev, engine):
    assert "--profiler-config" in error_of(dev.post("/start_profile"), 400)
    engine.profiler = True
    assert dev.post("/start_profile").status_code == 200 and dev.post("/stop_profile").status_code == 200
    assert [name for name, _ in engine.operations] == ["start_profile", "stop_profile"]


def test_collective_rpc(dev, engine):
    answer = dev.post("/collective_rpc", json={"method": "echo", "args": ["a"], "kwargs": {"k": "v"}, "timeout": 5})
    assert answer.json() == {"results": [{"method": "echo", "args": ["a"]}, None, "worker 2"]}
    assert engine.operations[-1] == ("collective_rpc", ("echo", 5, ("a",), {"k": "v"}))
    error_of(dev.post("/collective_rpc", json={"args": []}), 400, "method")
    error_of(dev.post("/collective_rpc", json={"method": "echo", "args": [1]}), 400, "args[0]")
    error_of(dev.post("/collective_rpc", json={"method": "echo", "timeout": 0}), 400, "timeout")


def test_server_info(dev):
    assert dev.get("/server_info").json()["vllm_config"] == "model=fake"
    info = dev.get("/server_info?config_format=json").json()
    assert info["vllm_config"] == {"model": "fake"} and "vllm_env" in info and "system_env" in info
    error_of(dev.get("/server_info?config_format=yaml"), 400, "config_format")


def test_behind_the_key(engine):
    app = create_app(Settings(served_model_name="fake-model", dev_mode=True, api_keys=("k",)),
                     engine_factory=fake_engine_factory(engine))
    with TestClient(app) as client:
        for method, path in [*ROUTES, ("GET", "/kv_event_sources")]:
            assert client.request(method, path).status_code == 401, path
        assert client.get("/is_paused", headers={"Authorization": "Bearer k"}).json() == {"is_paused": False}
