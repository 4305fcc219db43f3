"""Every error is an OpenAI error body with a matching status, a useful message and the right param."""

import pytest

from choir.core.errors import EngineRejected
from choir.engine.protocol import NO_OPTIONS, EngineDead
from tests.sse import sse_json

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def error_of(response, status: int, param: str | None = None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["param"] == param and error["message"]
    return error["message"]


def test_unknown_route_is_404(client):
    assert "/schema" in error_of(client.get("/v1/nothing"), 404)


def test_wrong_method_is_405(client):
    error_of(client.delete("/v1/completions"), 405)
    error_of(client.post("/v1/models"), 405)


def test_bad_json_is_400(client):
    message = error_of(client.post("/v1/completions", content=b'{"prompt": ', headers={"content-type":
                                                                                      "application/json"}), 400)
    assert "JSON" in message


def test_wrong_content_type_is_415(client):
    message = error_of(client.post("/v1/completions", content=b'{"prompt": "x"}',
                                   headers={"content-type": "application/x-www-form-urlencoded"}), 415)
    assert "application/json" in message


@pytest.mark.parametrize("body, param", [
    ({}, None),
    ({"prompt": "x", "temperature": 3}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "seed": 2**63}, "seed"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": "x", "n": 129}, "n"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 1.5}, "n"),
    ({"prompt": "x", "n": "2"}, "n"),
    ({"prompt": "x", "n": 3, "seed": 2**63 - 2}, "seed"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "model": "gpt-4"}, "model"),
    ({"prompt": "x", "min_tokens": 20, "max_tokens": 5}, None),
])
def test_invalid_completion_requests_are_400(client, fake_engine, body, param):
    response = client.post("/v1/completions", json=body)
    if param is None:
        assert response.status_code == 400 and response.json()["error"]["message"]
    else:
        error_of(response, 400, param)
    assert fake_engine.calls == []


def test_missing_field_names_it(client):
    assert "prompt" in client.post("/v1/completions", json={}).json()["error"]["message"]


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].image_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                                          "iVBORw0KGgo="}}]}]},
     "messages[0].content[0]"),  # the model reads text only
    ({"messages": [{"role": "user", "content": [{"type": "audio", "audio": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content[0].type"),
    ({"messages": MESSAGES, "tools": TOOLS}, "tool_choice"),  # auto, and no tool parser configured
    ({"messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
    ({"messages": MESSAGES, "tool_choice": "required"}, "tool_choice"),
    ({"messages": MESSAGES, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"messages": MESSAGES, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice"),
    ({"messages": MESSAGES, "tools": TOOLS, "tool_choice": "maybe"}, "tool_choice"),
    ({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "bad name!"}}],
      "tool_choice": "required"}, "tools[0].function.name"),
    ({"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"messages": MESSAGES, "response_format": {"type": "xml"}}, "response_format.type"),
    ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MESSAGES, "top_logprobs": -2, "logprobs": True}, "top_logprobs"),
    ({"messages": MESSAGES, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": MESSAGES, "model": "nope"}, "model"),
])
def test_invalid_chat_requests_are_400(client, fake_engine, body, param):
    message = error_of(client.post(CHAT, json=body), 400, param)
    assert message
    assert fake_engine.calls == []


def test_unknown_model_names_the_served_model(client):
    message = error_of(client.post("/v1/completions", json={"prompt": "x", "model": "gpt-4"}), 400, "model")
    assert message == "The model `gpt-4` does not exist. The served model name is `fake-model`."


def test_prompt_longer_than_the_context_is_400(client, fake_engine):
    message = error_of(client.post("/v1/completions", json={"prompt": "x" * 100}), 400, "prompt")
    assert "maximum context length is 64" in message
    error_of(client.post(CHAT, json={"messages": [{"role": "user", "content": "x" * 100}]}), 400, "messages")


def test_max_tokens_over_the_context_is_400(client):
    message = error_of(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 65}), 400, "max_tokens")
    assert "65" in message and "64" in message
    error_of(client.post(CHAT, json={"messages": MESSAGES, "max_completion_tokens": 100}), 400,
             "max_completion_tokens")


def test_max_tokens_within_the_context_is_clamped_to_what_is_left(client, fake_engine):
    client.post("/v1/completions", json={"prompt": "x" * 10, "max_tokens": 64})
    assert fake_engine.calls[0].params.max_tokens == 64 - 11


def test_engine_validation_error_before_a_stream_is_a_400_not_a_stream(client, fake_engine):
    fake_engine.fail_with = EngineRejected("Token id 999999 is out of vocabulary.")
    response = client.post("/v1/completions", json={"prompt": [999999], "stream": True})
    assert "out of vocabulary" in error_of(response, 400)


def test_dead_engine_is_503(client, fake_engine):
    fake_engine.fail_with = EngineDead("gone")
    error_of(client.post("/v1/completions", json={"prompt": "x"}), 503)


def test_unexpected_engine_failure_is_a_500_without_internals(client, fake_engine):
    fake_engine.fail_with = RuntimeError("secret /internal/path")
    message = error_of(client.post("/v1/completions", json={"prompt": "x"}), 500)
    assert "secret" not in message


@pytest.mark.parametrize("bug", [ValueError("a bug of ours"), TypeError("another"), KeyError("k")])
def test_a_bug_is_a_500_with_the_request_id_never_the_clients_fault(client, fake_engine, bug):
    """Only the engine's refusals (EngineRejected) are 4xx: a ValueError elsewhere is Choir's own."""
    from structlog.testing import capture_logs

    fake_engine.fail_with = bug
    with capture_logs() as logs:
        response = client.post("/v1/completions", json={"prompt": "x"}, headers={"X-Request-Id": "bug-1"})
    message = error_of(response, 500)
    assert "cmpl-bug-1" in message and "bug of ours" not in message and "another" not in message
    [logged] = [entry for entry in logs if entry["event"] == "unhandled error"]
    assert logged["request_id"] == "cmpl-bug-1" and logged["exc_info"] is bug


def test_a_bug_mid_stream_is_a_500_event_with_the_request_id(client, fake_engine):
    original = fake_engine.generate

    async def generate(prompt, params, request_id, options=NO_OPTIONS):
        async for output in original(prompt, params, request_id, options):
            yield output
            raise TypeError("internal detail")

    fake_engine.generate = generate
    response = client.post(CHAT, json={"messages": MESSAGES, "stream": True}, headers={"X-Request-Id": "bug-2"})
    events, done = sse_json(response.text)
    error = events[-1]["error"]
    assert done == 1 and error["code"] == 500 and "chatcmpl-bug-2" in error["message"]
    assert "internal detail" not in error["message"]


def test_error_after_the_stream_started_is_one_error_event_then_done(client, fake_engine):
    def script(prompt, params):
        yield "ok"
        raise ValueError("broke mid-stream")

    original = fake_engine.generate

    async def failing_generate(prompt, params, request_id, options=NO_OPTIONS):
        async for output in original(prompt, params, request_id, options):
            yield output
            raise EngineDead("engine died mid-stream")

    fake_engine.generate = failing_generate
    response = client.post(CHAT, json={"messages": MESSAGES, "stream": True})
    assert response.status_code == 200
    events, done = sse_json(response.text)
    assert done == 1
    assert events[-1]["error"]["code"] == 503 and set(events[-1]["error"]) == {"message", "type", "param", "code"}


def test_health_is_503_once_the_engine_is_dead(client, fake_engine):
    assert client.get("/health").status_code == 200
    fake_engine.is_alive = False
    error_of(client.get("/health"), 503)


def test_version(client):
    body = client.get("/version").json()
    assert body["vllm"] == "fake" and body["version"]
