"""Bearer API keys: every /v1 route and method needs one; health, version and (by default) docs don't."""

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import RoleModel, Settings
from choir.plugins.auth import METRICS, OPEN
from choir.plugins.spec import load_spec
from tests.fakes import FakeEngine, FakePoolingEngine, fake_engine_factory

KEYS = ("first-key", "second-key")
V1_ROUTES = [("GET", "/v1/models", None), ("GET", "/v1/models/fake-model", None),
             ("POST", "/v1/completions", {"prompt": "x"}),
             ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
             ("POST", "/tokenize", {"prompt": "x"}), ("POST", "/detokenize", {"tokens": [70]}),
             ("POST", "/v1/embeddings", {"input": "x"}),
             ("POST", "/v1/chat/completions/batch", {"messages": [[{"role": "user", "content": "x"}]]}),
             ("POST", "/invocations", {"prompt": "x"}),
             ("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/adapters/a", "load_inplace": True})]
UNLOAD = ("POST", "/v1/unload_lora_adapter", {"lora_name": "a"})  # once it answers, there is nothing to unload


def make_client(**settings):
    app = create_app(Settings(served_model_name="fake-model", api_keys=KEYS, allow_runtime_lora=True,
                              pooling=(RoleModel("embed", "/models/fake-embed"),), **settings),
                     engine_factory=fake_engine_factory(FakeEngine()),
                     factories={"embed": fake_engine_factory(FakePoolingEngine())})
    return TestClient(app)


@pytest.fixture(scope="module")
def client():
    with make_client() as test_client:
        yield test_client


def assert_401(response):
    assert response.status_code == 401, response.text
    assert response.json()["error"]["type"] == "AuthenticationError" and response.json()["error"]["code"] == 401
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("method, path, body", [*V1_ROUTES, UNLOAD])
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic first-key", "first-key", "Bearer "])
def test_v1_routes_refuse_a_missing_or_wrong_key(client, method, path, body, authorization):
    headers = {"Authorization": authorization} if authorization is not None else {}
    assert_401(client.request(method, path, json=body, headers=headers))


@pytest.mark.parametrize("method, path, body", V1_ROUTES)
@pytest.mark.parametrize("authorization", ["Bearer first-key", "bearer second-key", "BEARER first-key"])
def test_v1_routes_accept_any_configured_key_with_any_scheme_case(client, method, path, body, authorization):
    assert client.request(method, path, json=body, headers={"Authorization": authorization}).status_code == 200


@pytest.mark.parametrize("method, path, body", V1_ROUTES)
def test_v1_routes_accept_the_key_as_x_api_key(client, method, path, body):
    """As Anthropic's clients send it; a Bearer header that is not a key does not hide it."""
    for headers in ({"x-api-key": "second-key"}, {"x-api-key": "first-key", "Authorization": "Basic abc"}):
        assert client.request(method, path, json=body, headers=headers).status_code == 200
    assert_401(client.request(method, path, json=body, headers={"x-api-key": "wrong"}))
    assert_401(client.request(method, path, json=body, headers={"x-api-key": "first-key",
                                                                "Authorization": "Bearer wrong"}))


@pytest.mark.parametrize("method, path, content", [
    ("GET", "/v1/nothing", None), ("DELETE", "/v1/models", None), ("PUT", "/v1/completions", None),
    ("POST", "/v1/completions", b"{not json"), ("POST", "/v1/completions", b'{"prompt": 5.5}')])
def test_401_comes_before_404_405_and_validation(client, method, path, content):
    assert_401(client.request(method, path, content=content, headers={"content-type": "application/json"}))


def test_with_a_key_the_route_errors_come_back(client):
    headers = {"Authorization": "Bearer first-key"}
    method, path, body = UNLOAD
    client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/adapters/a", "load_inplace": True},
                headers=headers)
    assert client.request(method, path, json=body, headers=headers).status_code == 200
    assert client.get("/v1/nothing", headers=headers).status_code == 404
    assert client.delete("/v1/models", headers=headers).status_code == 405


@pytest.mark.parametrize("path", ["/health", "/ping", "/ready", "/load", "/version", "/metrics", "/schema",
                                  "/schema/openapi.json", "/schema/assets/swagger-ui.css"])
def test_health_version_and_docs_stay_open(client, path):
    assert client.get(path).status_code == 200


def test_a_setting_closes_the_docs_too():
    with make_client(protect_docs=True) as client:
        assert_401(client.get("/schema"))
        assert_401(client.get("/schema/openapi.json"))
        assert client.get("/schema", headers={"Authorization": "Bearer first-key"}).status_code == 200
        assert client.get("/health").status_code == 200


def test_a_setting_protects_the_metrics():
    with make_client(protect_metrics=True) as client:
        assert_401(client.get("/metrics"))
        assert client.get("/metrics", headers={"Authorization": "Bearer second-key"}).status_code == 200


def test_without_keys_everything_is_open():
    app = create_app(Settings(served_model_name="fake-model"), engine_factory=fake_engine_factory(FakeEngine()))
    with TestClient(app) as client:
        assert client.get("/v1/models").status_code == 200


def test_the_spec_declares_the_bearer_and_x_api_key_schemes():
    spec = load_spec()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["BearerAuth"] == {"type": "http", "scheme": "bearer", "description": schemes["BearerAuth"][
        "description"]}
    assert schemes["ApiKeyAuth"] == {"type": "apiKey", "in": "header", "name": "x-api-key",
                                     "description": schemes["ApiKeyAuth"]["description"]}
    assert spec["security"] == [{"BearerAuth": []}, {"ApiKeyAuth": []}]  # either one
    assert spec["paths"]["/health"]["get"]["security"] == [] and spec["paths"]["/version"]["get"]["security"] == []
    open_in_spec = {path for path, item in spec["paths"].items() for operation in item.values()
                    if isinstance(operation, dict) and operation.get("security") == []}
    assert open_in_spec == set(OPEN) | {METRICS}


def test_api_keys_setting_is_a_comma_separated_list(tmp_path):
    s = Settings.from_env({"CHOIR_API_KEY": " a , b,,c "}, env_file=tmp_path / "none")
    assert s.api_keys == ("a", "b", "c")


@pytest.mark.parametrize("path", ["/llm/v1/models", "/v1/models", "/llm/invocations", "/llm/v1/nope"])
def test_behind_a_root_path_the_routes_stay_protected(path):
    """uvicorn --root-path /llm: /llm/v1/... is routed as /v1/..., and needs the key alike."""
    app = create_app(Settings(served_model_name="fake-model", api_keys=KEYS),
                     engine_factory=fake_engine_factory(FakeEngine()))
    with TestClient(app, root_path="/llm") as client:
        method = client.post if "invocations" in path else client.get
        assert method(path).status_code == 401
        if path.endswith("models"):
            assert client.get(path, headers={"Authorization": "Bearer first-key"}).status_code == 200


def test_under_uvicorns_root_path():
    """uvicorn --root-path /llm puts the root path before the request's path: a client's /v1/... and a
    proxy's /llm/v1/... both reach the routes, behind the key (vLLM's server answers both)."""
    import threading
    import time

    import httpx
    import uvicorn

    from tests.integration.server import free_port

    app = create_app(Settings(served_model_name="fake-model", api_keys=KEYS),
                     engine_factory=fake_engine_factory(FakeEngine()))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, root_path="/llm", log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        base, key = f"http://127.0.0.1:{port}", {"Authorization": "Bearer first-key"}
        for path in ("/llm/v1/models", "/v1/models"):
            assert httpx.get(base + path, headers=key).json()["data"][0]["id"] == "fake-model"
            assert httpx.get(base + path).status_code == 401
        for path in ("/llm/v1/nope", "/v1/nope"):
            assert httpx.get(base + path).status_code == 401 and httpx.get(base + path, headers=key).status_code == 404
        assert httpx.get(base + "/llm/health").status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("path", ["/fake/v1/models/fake-model", "/v1/models/fake-model",
                                  "/fake/fake/v1/models/fake-model"])
def test_a_root_path_inside_the_route_path_is_left_alone(path):
    """`/fake` in `/v1/models/fake-model`: only the leading root is the root (Litestar's router alone would
    cut the path at the root's first occurrence anywhere)."""
    app = create_app(Settings(served_model_name="fake-model"), engine_factory=fake_engine_factory(FakeEngine()))
    with TestClient(app, root_path="/fake") as client:
        response = client.get(path)
    assert response.status_code == 200 and response.json()["id"] == "fake-model", response.text
