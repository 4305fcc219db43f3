"""vLLM's front-end settings Choir serves beyond the OpenAI API's own fields: --response-role (a chat answer's
role) and CORS (--allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials); and every setting
`choir serve` writes is one Settings reads (none is silently ignored)."""

import inspect
import json

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.cli import flags
from choir.core import settings as settings_module
from choir.core.settings import Settings, SettingsError
from tests.fakes import FakeEngine, fake_engine_factory
from tests.sse import sse_json

MESSAGES = [{"role": "user", "content": "hi"}]


def make_client(**settings):
    app = create_app(Settings(served_model_name="fake-model", **settings),
                     engine_factory=fake_engine_factory(FakeEngine()))
    return TestClient(app)


def test_the_response_role_names_whole_and_streamed_answers():
    with make_client(response_role="narrator") as client:
        whole = client.post("/v1/chat/completions", json={"messages": MESSAGES}).json()
        assert whole["choices"][0]["message"]["role"] == "narrator"
        stream = client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True, "n": 2})
        events, _ = sse_json(stream.text)
        roles = [event["choices"][0]["delta"].get("role") for event in events if event["choices"]]
        assert sorted(filter(None, roles)) == ["narrator", "narrator"]  # each choice's first chunk


def test_an_answer_that_continues_a_message_takes_its_role():
    """add_generation_prompt false: the answer continues the last message (vLLM's rule)."""
    with make_client(response_role="narrator") as client:
        body = {"messages": [*MESSAGES, {"role": "assistant", "content": "Once"}], "add_generation_prompt": False,
                "continue_final_message": True}
        assert client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["role"] == "assistant"


def test_the_default_role_is_assistant(client):
    assert client.post("/v1/chat/completions", json={"messages": MESSAGES}).json()["choices"][0]["message"]["role"] \
        == "assistant"


def test_cors_answers_an_allowed_origin_only():
    with make_client(allowed_origins=("https://app.example",), allowed_methods=("GET", "POST"),
                     allow_credentials=True) as client:
        preflight = client.options("/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        assert preflight.headers["access-control-allow-credentials"] == "true"
        models = client.get("/v1/models", headers={"Origin": "https://app.example"})
        assert models.headers["access-control-allow-origin"] == "https://app.example"
        other = client.get("/v1/models", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_no_origin_allowed_no_cors_headers(client):
    response = client.get("/v1/models", headers={"Origin": "https://app.example"})
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("CHOIR_CHAT_TEMPLATE_CONTENT_FORMAT", "xml", "is not one of auto, string, openai"),
    ("CHOIR_DEFAULT_CHAT_TEMPLATE_KWARGS", "[1]", "is not a JSON object"),
    ("CHOIR_DEFAULT_CHAT_TEMPLATE_KWARGS", "{oops", "is not a JSON object"),
    ("CHOIR_ALLOWED_ORIGINS", '["a", 1]', "is not a JSON list of strings"),
    ("CHOIR_MAX_LOG_LEN", "many", "is not a number of characters"),
    ("CHOIR_ALLOW_CREDENTIALS", "maybe", "is not a boolean"),
])
def test_a_bad_front_end_setting_is_one_line(variable, value, says):
    with pytest.raises(SettingsError, match=says):
        Settings.from_env({variable: value}, env_file=None)


def test_front_end_settings_from_the_environment():
    settings = Settings.from_env({"CHOIR_ALLOWED_ORIGINS": "https://a.example, https://b.example",
                                  "CHOIR_DEFAULT_CHAT_TEMPLATE_KWARGS": json.dumps({"enable_thinking": True}),
                                  "CHOIR_RESPONSE_ROLE": "bot", "CHOIR_MAX_LOG_LEN": "12"}, env_file=None)
    assert settings.allowed_origins == ("https://a.example", "https://b.example")
    assert settings.default_chat_template_kwargs == {"enable_thinking": True}
    assert settings.response_role == "bot" and settings.max_log_len == 12 and settings.allowed_methods == ("*",)


def test_every_setting_the_command_line_writes_is_read():
    source = inspect.getsource(settings_module)
    written = {variable for variable, _ in flags.SETTINGS.values()} | {v for _, v in flags.CHOIR_FLAGS}
    prefixes = ("CHOIR_EMBEDDING_", "CHOIR_RERANK_", "CHOIR_CLASSIFY_")  # read as role.variable(...)
    unread = sorted(v for v in written if f'"{v}"' not in source and not v.startswith(prefixes))
    assert not unread, f"settings the command line writes and Settings never reads: {unread}"


def test_docs_off_serve_no_schema():
    """vLLM's --disable-fastapi-docs: no /schema, no docs assets; the API is served as ever."""
    with make_client(docs=False) as client:
        assert client.get("/schema").status_code == 404
        assert client.get("/schema/openapi.json").status_code == 404
        assert client.get("/v1/models").status_code == 200
    with make_client() as client:
        assert client.get("/schema/openapi.json").status_code == 200


def test_quiet_paths_are_counted_not_logged():
    """vLLM's --disable-access-log-for-endpoints: a probe's requests leave no log line; others do."""
    from structlog.testing import capture_logs

    with make_client(quiet_paths=("/health", "/metrics")) as client, capture_logs() as logs:
        client.get("/health")
        client.get("/v1/models")
        metrics = client.get("/metrics").text
    assert [entry["path"] for entry in logs if entry["event"] == "request"] == ["/v1/models"]
    assert any(line.startswith("choir_requests_total{") and 'route="health"' in line for line in metrics.splitlines())
