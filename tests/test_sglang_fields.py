"""SGLang's own request fields over a scripted fake engine: honoured as SGLang honours them under the
default (sglang) profile, ignored with a warning (as vLLM's server ignores them) under the vllm profile."""

import pytest
from structlog.testing import capture_logs

from choir.core.protocol.chat import ChatCompletionRequest
from choir.core.protocol.common import SGLANG_FIELDS
from choir.core.protocol.completions import CompletionRequest
from tests.fakes import FakeEngine, decode
from tests.sse import sse_json
from tests.test_compat import make_client
from tests.test_parsers_routes import script, token_pieces, use_parsers

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
BODIES = {"/v1/completions": {"prompt": "x"}, CHAT: {"messages": MESSAGES}}
BOTH = pytest.mark.parametrize("path", list(BODIES))


def test_every_sglang_field_is_a_field_of_a_generation_request():
    from choir.core.compat import known_fields

    assert SGLANG_FIELDS <= known_fields(ChatCompletionRequest) | known_fields(CompletionRequest)


@BOTH
@pytest.mark.parametrize("field, kind, value", [("regex", "regex", "[ab]+"), ("ebnf", "grammar", 'root ::= "a"')])
def test_regex_and_ebnf_constrain_the_output(client, fake_engine, path, field, kind, value):
    assert client.post(path, json={**BODIES[path], field: value}).status_code == 200
    assert getattr(fake_engine.calls[0].params.structured_outputs, kind) == value


def test_completions_json_schema_is_a_schema_as_text(client, fake_engine):
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    assert client.post("/v1/completions", json={"prompt": "x", "json_schema": schema}).status_code == 200
    assert fake_engine.calls[0].params.structured_outputs.json == schema


@pytest.mark.parametrize("path, extra, param", [
    ("/v1/completions", {"regex": "a", "ebnf": 'root ::= "a"'}, "regex"),
    ("/v1/completions", {"ebnf": 'root ::= "a"', "json_schema": "{}"}, "ebnf"),
    ("/v1/completions", {"json_schema": "{}", "response_format": {"type": "json_object"}}, "json_schema"),
    (CHAT, {"regex": "a", "response_format": {"type": "json_object"}}, "regex"),
    (CHAT, {"regex": "a", "structured_outputs": {"regex": "b"}}, "regex"),
    (CHAT, {"regex": "a", "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     "regex"),
])
def test_one_constraint_at_most(client, fake_engine, path, extra, param):
    response = client.post(path, json={**BODIES[path], **extra})
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    assert fake_engine.calls == []


@BOTH
def test_no_stop_trim_keeps_the_stop_string(client, fake_engine, path):
    client.post(path, json={**BODIES[path], "stop": ["wor"], "no_stop_trim": True})
    assert fake_engine.calls[0].params.include_stop_str_in_output is True


@BOTH
def test_rid_is_the_request_id(client, fake_engine, path):
    body = client.post(path, json={**BODIES[path], "rid": "abc"}).json()
    assert body["id"].endswith("-abc") and fake_engine.calls[0].request_id == body["id"]


@BOTH
def test_extra_key_salts_the_prefix_cache_after_cache_salt(client, fake_engine, path):
    client.post(path, json={**BODIES[path], "cache_salt": "s1", "extra_key": "k2"})
    client.post(path, json={**BODIES[path], "extra_key": "k3"})
    assert [render.cache_salt for render in fake_engine.renders] == ["s1k2", "k3"]
    for extra, param in ((({"cache_salt": "a" * 100, "extra_key": "b" * 40}), "extra_key"),
                         ({"extra_key": "a/b"}, "extra_key"), ({"cache_salt": "a/b", "extra_key": "c"}, "cache_salt")):
        response = client.post(path, json={**BODIES[path], **extra})
        assert response.status_code == 400 and response.json()["error"]["param"] == param


@BOTH
def test_lora_path_names_a_loaded_adapter(client, fake_engine, path):
    fake_engine.adapters["tiny-lora"] = "/adapters/tiny"
    body = client.post(path, json={**BODIES[path], "model": "fake-model", "lora_path": "tiny-lora"}).json()
    assert fake_engine.calls[0].options.adapter == "tiny-lora" and body["model"] == "fake-model"
    response = client.post(path, json={**BODIES[path], "lora_path": "nope"})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "lora_path" and "tiny-lora" in error["message"]


@BOTH
def test_a_model_named_base_colon_adapter(client, fake_engine, path):
    fake_engine.adapters["tiny-lora"] = "/adapters/tiny"
    body = client.post(path, json={**BODIES[path], "model": "fake-model:tiny-lora"}).json()
    assert fake_engine.calls[0].options.adapter == "tiny-lora" and body["model"] == "fake-model:tiny-lora"
    for model, param in (("fake-model:nope", "model"), ("other:tiny-lora", "model")):
        response = client.post(path, json={**BODIES[path], "model": model})
        assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_separate_reasoning_false_leaves_the_reasoning_in_the_content(client, fake_engine):
    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    text = "<think>Hmm.</think>Paris."
    fake_engine.script = script(*token_pieces(text))
    separate = client.post(CHAT, json={"messages": MESSAGES}).json()["choices"][0]["message"]
    assert (separate["reasoning_content"], separate["content"]) == ("Hmm.", "Paris.")
    body = {"messages": MESSAGES, "separate_reasoning": False}
    together = client.post(CHAT, json=body).json()["choices"][0]["message"]
    assert together["content"] == text and together.get("reasoning_content") is None
    chunks, _ = sse_json(client.post(CHAT, json={**body, "stream": True}).text)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == text
    assert not any(d.get("reasoning_content") for d in deltas)


@pytest.mark.parametrize("text, ends", [("<think>Let me think hard.</think>Paris is nice.", True),
                                        ("<think>Still thinking about", False)])
def test_stream_reasoning_false_sends_the_reasoning_in_one_delta(client, fake_engine, text, ends):
    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    fake_engine.script = script(*token_pieces(text))
    chunks, _ = sse_json(client.post(CHAT, json={"messages": MESSAGES, "stream": True,
                                                 "stream_reasoning": False}).text)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    reasoning = [d["reasoning_content"] for d in deltas if d.get("reasoning_content")]
    assert len(reasoning) == 1
    thought = text.removeprefix("<think>").partition("</think>")[0]
    assert reasoning[0] == thought
    assert "".join(d.get("content") or "" for d in deltas) == (text.partition("</think>")[2] if ends else "")
    streamed, _ = sse_json(client.post(CHAT, json={"messages": MESSAGES, "stream": True}).text)
    assert len([c for c in streamed if c["choices"][0]["delta"].get("reasoning_content")]) > 1  # by default


def test_a_response_format_with_its_schema_beside_type_is_wrapped(client, fake_engine):
    schema = {"title": "Answer", "type": "object", "properties": {"a": {"type": "string"}}}
    response = client.post(CHAT, json={"messages": MESSAGES, "response_format": {"type": "json_schema",
                                                                                 "schema": schema}})
    assert response.status_code == 200 and fake_engine.calls[0].params.structured_outputs.json == schema


@pytest.mark.parametrize("extra", [{"regex": "[ab]+"}, {"no_stop_trim": True, "stop": ["x"]}, {"rid": "abc"},
                                   {"lora_path": "nope"}, {"stop_regex": "a+"}, {"separate_reasoning": False}])
def test_the_vllm_profile_ignores_them_with_a_warning(extra):
    with make_client("vllm") as client, capture_logs() as logs:
        body = client.post(CHAT, json={"messages": MESSAGES, **extra})
        assert body.status_code == 200, body.text
        assert not body.json()["id"].endswith("abc")
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert [w["fields"] for w in warnings] == [[name for name in extra if name != "stop"]]
    with make_client("vllm", engine=(engine := FakeEngine())) as client:
        client.post(CHAT, json={"messages": MESSAGES, **extra})
        params = engine.calls[0].params
        assert params.structured_outputs is None and params.include_stop_str_in_output is False


@pytest.mark.parametrize("path, body", [(CHAT, {"messages": [{"role": "my-custom-role", "content": "hi"}]}),
                                        ("/tokenize", {"messages": [{"role": "user", "content": "a"},
                                                                    {"role": "my-custom-role", "content": "hi"}]})])
def test_custom_roles_are_a_400_under_sglang_and_reach_the_template_under_vllm(path, body):
    with make_client("sglang") as client:
        response = client.post(path, json=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"].endswith("].role") and "my-custom-role" in error["message"]
    engine = FakeEngine()
    with make_client("vllm", engine=engine) as client:
        response = client.post(path, json=body)
        assert response.status_code == 200
    tokens = response.json()["tokens"] if path == "/tokenize" else engine.calls[0].prompt.token_ids
    assert "<my-custom-role>hi" in decode(tokens)  # the fake template writes each role as it is
