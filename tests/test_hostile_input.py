"""Hostile bytes get a 4xx in OpenAI's shape, never a 500; every request, however it ends, gets its log line
and its counter; a caller without a key learns nothing about the routes."""

import json

import pytest
from litestar.testing import TestClient
from structlog.testing import capture_logs

from choir.app.asgi import create_app
from choir.app.requests import nests_deeper
from choir.core.errors import APIError
from choir.core.settings import Settings
from choir.plugins.auth import AuthConfig
from tests.fakes import FakeEngine, fake_engine_factory

KEY = "hostile-key"
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def keyed():
    app = create_app(Settings(served_model_name="fake-model", api_keys=(KEY,)),
                     engine_factory=fake_engine_factory(FakeEngine()))
    with TestClient(app) as client:
        yield client


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def assert_openai_error(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and isinstance(error["message"], str) and "type" in error
    return error


@pytest.mark.parametrize("depth", [129, 500, 1000, 100_000])
@pytest.mark.parametrize("where", ["extra", "content", "tool"])
def test_a_body_nested_past_the_bound_is_a_400(client, depth, where):
    body = {**CHAT, "extra": "X"} if where == "extra" else CHAT
    text = json.dumps(body)
    if where == "extra":
        text = text.replace('"X"', nested(depth))
    elif where == "content":
        text = text.replace('"hi"', nested(depth))
    else:
        text = text[:-1] + ', "tools": [{"type": "function", "function": {"name": "f", "parameters": ' + \
            '{"x": ' * depth + "1" + "}" * depth + "}}]}"
    response = client.post("/v1/chat/completions", content=text, headers={"content-type": "application/json"})
    error = assert_openai_error(response, 400)
    assert "CHOIR_MAX_JSON_DEPTH" in error["message"]


def test_nesting_up_to_the_bound_is_decoded(client):
    text = json.dumps({**CHAT, "extra": "X"}).replace('"X"', nested(126))  # 126 + the body + nothing else
    response = client.post("/v1/chat/completions", content=text, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text


def test_brackets_inside_strings_are_text_not_depth():
    text = json.dumps({"prompt": "[" * 5000 + '\\"{' * 300})
    assert not nests_deeper(text.encode(), 128)
    assert nests_deeper(nested(129).encode(), 128) and not nests_deeper(nested(128).encode(), 128)
    assert not nests_deeper(("[" * 100 + "]" * 100) .encode() * 50, 128)  # many brackets, shallow


def test_the_depth_bound_is_a_setting():
    app = create_app(Settings(served_model_name="fake-model", max_json_depth=4),
                     engine_factory=fake_engine_factory(FakeEngine()))
    with TestClient(app) as client:
        ok = client.post("/v1/completions", json={"prompt": "x", "extra": [[1]]})
        refused = client.post("/v1/completions", json={"prompt": "x", "extra": [[[[1]]]]})
    assert ok.status_code == 200
    assert "at most 4" in assert_openai_error(refused, 400)["message"]


@pytest.mark.parametrize("token", [b"\xff\xfe", b"\xc3", b"caf\xe9", KEY.encode() + b"\xff"])
@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions", "/tokenize", "/v1/nope"])
def test_a_key_that_is_not_utf8_is_a_401(keyed, token, path):
    response = keyed.post(path, json=CHAT, headers={"Authorization": b"Bearer " + token})
    assert_openai_error(response, 401)


SPELLINGS = ["//v1/models", "/v1//models", "/./v1/models", "/v1/./models", "/v1%2Fmodels", "/v1/models/",
             "/V1/MODELS", "/v1/x/../models", "//v1/nope", "/v1/nope", "/nope", "//tokenize", "/tokenize/",
             "/TOKENIZE", "//detokenize", "/detokenize/", "/.//v1/chat/completions", "/v1/chat/completions/",
             "/health/../v1/models", "/schema/../v1/models", "/metrics/../tokenize", "/"]


@pytest.mark.parametrize("path", SPELLINGS)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_without_a_key_every_spelling_is_a_401(keyed, path, method):
    response = keyed.request(method, path, json=CHAT)
    assert_openai_error(response, 401)
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("path", SPELLINGS)
def test_with_the_key_the_router_answers(keyed, path):
    response = keyed.get(path, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code in (200, 404, 405), response.text  # whatever the router makes of it


@pytest.mark.parametrize("path, open_", [("/health", True), ("/version", True), ("/metrics", True),
                                         ("/schema/openapi.json", True), ("/schema/assets/{file_path}", True),
                                         ("/HEALTH", False), ("/healthz", False), ("/health/x", False),
                                         ("/health/../v1/models", False), ("/schemas", False)])
def test_only_the_open_paths_are_open(path, open_):
    assert AuthConfig((KEY,)).is_open(path) is open_


# A path parameter that spells an open path once decoded and resolved (uvicorn decodes %25 → %, so the
# handler's parameter holds `..%2F..%2Fhealth`): the route is what decides, and it is protected.
@pytest.mark.parametrize("raw_path", [b"/v1/models/..%2F..%2F..%2Fhealth", b"/v1/models/x%2F..%2F..%2F..%2Fversion",
                                      b"/schema/assets/..%2F..%2Fhealth"])
@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_path_parameter_cannot_spell_its_way_to_an_open_path(method, raw_path):
    import asyncio
    app = create_app(Settings(served_model_name="fake-model", api_keys=(KEY,), protect_docs=True),
                     engine_factory=fake_engine_factory(FakeEngine()))
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": raw_path.decode().replace("%2F", "%2F"), "raw_path": raw_path.replace(b"%2F", b"%252F"),
             "query_string": b"", "root_path": "", "server": ("t", 80), "client": ("c", 1), "headers": []}
    with TestClient(app):  # the lifespan: the engine is up
        asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 401, sent


def requests_logged(client, do):
    with capture_logs() as logs:
        do()
    return [line for line in logs if line["event"] == "request"]


WITH_KEY = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize("method, path, headers, status", [
    ("GET", "/v1/models", {}, 401), ("GET", "/nope", {}, 401), ("GET", "/v1/nope", WITH_KEY, 404),
    ("DELETE", "/v1/models", WITH_KEY, 405), ("GET", "/v1/models", {"Authorization": "Bearer x"}, 401),
    ("PUT", "/health", {}, 405), ("GET", "/health/nope", {}, 401)])
def test_every_request_gets_a_line_and_a_count_and_the_key_is_never_logged(keyed, method, path, headers, status):
    before = _count(keyed, status)
    [line] = requests_logged(keyed, lambda: keyed.request(method, path, headers=headers))
    assert line["status"] == status and line["path"] == path and line["method"] == method
    assert KEY not in repr(line) and "Bearer" not in repr(line)
    assert _count(keyed, status) == before + 1


def _count(client, status):
    from prometheus_client.parser import text_string_to_metric_families
    text = client.get("/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "choir_requests_total" and sample.labels["status"] == str(status))


def test_status_499_has_a_body_and_a_type():
    error = APIError(499, "left").body.error
    assert error.type == "ClientClosedRequestError" and error.code == 499
    assert APIError(418, "teapot").body.error.type == "I'maTeapotError"  # HTTPStatus's phrase


@pytest.mark.parametrize("name, value", [("CHOIR_MAX_JSON_DEPTH", "0"), ("CHOIR_MAX_GRAMMAR_BYTES", "big"),
                                         ("CHOIR_GRAMMAR_COMPILE_SECONDS", "0"), ("CHOIR_GRAMMAR_COMPILERS", "-1")])
def test_the_bounds_refuse_a_bad_value_in_one_line(name, value):
    from choir.core.settings import SettingsError
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})
