"""Compatibility rules as data: each rule of each profile, and a rule flipped by editing the spec."""

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.compat import CompatProfile
from choir.core.settings import Settings, SettingsError
from choir.plugins.spec import SPEC_DIR, SpecConfig
from tests.fakes import FakeEngine, fake_engine_factory
from tests.spec_copy import spec_copy
from tests.sse import sse_json

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def make_client(compat="sglang", spec_dir=SPEC_DIR, engine=None):
    app = create_app(Settings(served_model_name="fake-model"),
                     engine_factory=fake_engine_factory(engine or FakeEngine()), spec=SpecConfig(spec_dir, compat))
    return TestClient(app)


@pytest.fixture(params=["sglang", "vllm"])
def profile_client(request):
    with make_client(request.param) as client:
        yield request.param, client


def all_json(client, path, body):
    """Every JSON object the endpoint returns for `body`: the response, and each chunk when streamed."""
    plain = client.post(path, json=body).json()
    chunks, _ = sse_json(client.post(path, json={**body, "stream": True,
                                                 "stream_options": {"include_usage": True}}).text)
    return [plain, *chunks]


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "x"}), (CHAT, {"messages": MESSAGES})])
def test_system_fingerprint(profile_client, path, body):
    profile, client = profile_client
    objects = all_json(client, path, body)
    if profile == "sglang":
        assert not any("system_fingerprint" in obj for obj in objects)
    else:
        assert all(obj["system_fingerprint"].startswith("vllm-fake-") for obj in objects)


def test_reasoning_content_in_every_chat_delta(profile_client):
    profile, client = profile_client
    chunks, _ = sse_json(client.post(CHAT, json={"messages": MESSAGES, "stream": True, "n": 2}).text)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas and any("role" in d for d in deltas) and any(chunk["choices"][0]["finish_reason"] for chunk in chunks)
    if profile == "sglang":
        assert all("reasoning_content" in d and d["reasoning_content"] is None for d in deltas)
    else:
        assert not any("reasoning_content" in d for d in deltas)


@pytest.mark.parametrize("field, value", [("functions", [{"name": "f", "parameters": {}}]), ("function_call", "auto")])
def test_deprecated_function_fields(profile_client, field, value):
    profile, client = profile_client
    response = client.post(CHAT, json={"messages": MESSAGES, field: value})
    if profile == "sglang":
        assert response.status_code == 400
        error = response.json()["error"]
        # Either message alone tells a client both replacements.
        assert error["param"] == field and "`tools`" in error["message"] and "`tool_choice`" in error["message"]
    else:
        assert response.status_code == 200


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "x"}), (CHAT, {"messages": MESSAGES})])
def test_unknown_model(profile_client, path, body):
    profile, client = profile_client
    response = client.post(path, json={**body, "model": "gpt-4"})
    error = response.json()["error"]
    assert error["param"] == "model" and "The model `gpt-4` does not exist." in error["message"]
    assert "fake-model" in error["message"]
    assert response.status_code == (400 if profile == "sglang" else 404)
    assert client.post(path, json=body).status_code == 200  # an omitted model is the served one


def test_greedy_n(profile_client):
    profile, client = profile_client
    response = client.post(CHAT, json={"messages": MESSAGES, "n": 2, "temperature": 0})
    if profile == "sglang":
        assert response.status_code == 200 and len(response.json()["choices"]) == 2
    else:
        assert response.status_code == 400 and response.json()["error"]["param"] == "n"


def test_retrieve_model(profile_client):
    _, client = profile_client
    card = client.get("/v1/models/fake-model").json()
    assert card["id"] == "fake-model" and card["object"] == "model"
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


def test_retrieve_a_model_whose_id_has_slashes():
    with make_client(engine=FakeEngine(served_model_names=("org/some-model",))) as client:
        assert client.get("/v1/models/org/some-model").json()["id"] == "org/some-model"


def test_text_offset_is_a_real_offset_into_the_returned_text(profile_client):
    _, client = profile_client
    choice = client.post("/v1/completions", json={"prompt": "hi", "echo": True, "logprobs": 0}).json()["choices"][0]
    text, logprobs = choice["text"], choice["logprobs"]
    for token, offset in zip(logprobs["tokens"], logprobs["text_offset"], strict=True):
        assert offset >= 0
        assert text[offset:].startswith(token) or token == "<s>"  # bos is not in the text
    streamed, _ = sse_json(client.post("/v1/completions", json={"prompt": "hi", "logprobs": 0, "stream": True}).text)
    offsets = [o for chunk in streamed for o in chunk["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == list(range(len("Hello world!")))


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(SettingsError) as raised:
        CompatProfile.load(SPEC_DIR / "profiles", "openai-ish")
    assert "sglang" in str(raised.value) and "vllm" in str(raised.value)


def test_flipping_a_rule_in_a_copy_of_the_spec_changes_the_behaviour(tmp_path):
    def include_fingerprint(profile):
        profile["rules"]["system_fingerprint"] = "include"

    with make_client(spec_dir=spec_copy(tmp_path, profiles__sglang=include_fingerprint)) as client:
        assert "system_fingerprint" in client.post("/v1/completions", json={"prompt": "x"}).json()


def test_an_operation_that_drops_a_rule_stops_applying_it(tmp_path):
    def drop_unknown_model(spec):
        spec["paths"]["/v1/completions"]["post"]["x-choir-rules"].remove("unknown_model")

    with make_client(spec_dir=spec_copy(tmp_path, openapi=drop_unknown_model)) as client:
        assert client.post("/v1/completions", json={"prompt": "x", "model": "any"}).status_code == 200


def test_a_new_profile_is_a_file(tmp_path):
    spec_dir = spec_copy(tmp_path)
    (spec_dir / "profiles" / "strict.yaml").write_text(
        "extends: vllm\nrules:\n  unknown_model: {status: 422, message: 'no `{model}`'}\n")
    with make_client("strict", spec_dir) as client:
        response = client.post("/v1/completions", json={"prompt": "x", "model": "m"})
        assert response.status_code == 422 and response.json()["error"]["message"] == "no `m`"
        assert "system_fingerprint" in client.post("/v1/completions", json={"prompt": "x"}).json()  # from vllm


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "x"}), (CHAT, {"messages": MESSAGES}),
                                        ("/v1/responses", {"input": "x"}), ("/tokenize", {"prompt": "x"})])
def test_unknown_fields_are_ignored_with_a_warning_naming_them(profile_client, path, body):
    from structlog.testing import capture_logs

    _, client = profile_client
    with capture_logs() as logs:
        assert client.post(path, json={**body, "frobnicate": 1, "best_off": 2}).status_code == 200
    [warning] = [entry for entry in logs if entry["log_level"] == "warning"]
    assert warning["fields"] == ["frobnicate", "best_off"]
    with capture_logs() as logs:
        client.post(path, json=body)
    assert not [entry for entry in logs if entry["log_level"] == "warning"]  # known fields: no warning


def test_a_profile_may_reject_unknown_fields(tmp_path):
    def reject(profile):
        profile["rules"]["unknown_fields"] = "reject"

    with make_client(spec_dir=spec_copy(tmp_path, profiles__sglang=reject)) as client:
        response = client.post(CHAT, json={"messages": MESSAGES, "frobnicate": 1})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "frobnicate" and "`frobnicate`" in error["message"]
        assert client.post(CHAT, json={"messages": MESSAGES, "top_k": 3}).status_code == 200  # vLLM's fields are known


@pytest.mark.parametrize("path, body, where", [
    ("/v1/completions", {"prompt": "x"}, lambda obj: obj["choices"][0]),
    (CHAT, {"messages": MESSAGES}, lambda obj: obj),
])
def test_null_fields(profile_client, path, body, where):
    """vLLM's server sends its vLLM-only fields as null when they carry nothing; the default profile
    leaves them out. Asked for, they carry their values in both."""
    profile, client = profile_client
    plain = client.post(path, json=body).json()
    keys = ("token_ids", "prompt_token_ids", "prompt_logprobs") if path != CHAT else ("prompt_token_ids",
                                                                                     "prompt_logprobs")
    if profile == "vllm":
        assert all(where(plain)[key] is None for key in keys)
        assert path != CHAT or plain["choices"][0]["token_ids"] is None
    else:
        assert not any(key in where(plain) for key in keys)
    chunks, _ = sse_json(client.post(path, json={**body, "stream": True}).text)
    choices = [chunk["choices"][0] for chunk in chunks]
    if path == CHAT:
        assert ("prompt_token_ids" in chunks[0]) is (profile == "vllm")
        assert all(("token_ids" in choice) is (profile == "vllm") for choice in choices[1:])
    else:
        assert all(("token_ids" in choice) is (profile == "vllm") for choice in choices)
    asked = client.post(path, json={**body, "return_token_ids": True}).json()
    assert isinstance((asked["choices"][0] if path != CHAT else asked)["prompt_token_ids"], list)


def test_null_fields_are_checked_at_start_up(tmp_path):
    from choir.app.asgi import create_app

    for bad, says in (("{Nope: [a]}", "Nope"), ("{CompletionChoice: [text]}", "text"),
                      ("{ChatChoice: [tokens_ids]}", "tokens_ids")):
        (spec_dir := spec_copy(tmp_path / says))
        (spec_dir / "profiles" / "bad.yaml").write_text(f"extends: vllm\nrules:\n  null_fields: {bad}\n")
        with pytest.raises(SystemExit) as raised:
            create_app(Settings(), spec=SpecConfig(spec_dir, "bad"))
        assert says in str(raised.value) and "null_fields" in str(raised.value)


def test_a_token_prompt_is_echoed_without_special_tokens_under_sglang(profile_client):
    profile, client = profile_client
    body = {"prompt": [0, *[ord(c) + 3 for c in "The capital"]], "echo": True, "max_tokens": 1}
    text = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert text.startswith("The capital" if profile == "sglang" else "<s>The capital")
    chunks, _ = sse_json(client.post("/v1/completions", json={**body, "stream": True}).text)
    assert chunks[0]["choices"][0]["text"] == text[:len(chunks[0]["choices"][0]["text"])]
    words = client.post("/v1/completions", json={**body, "prompt": "The capital"}).json()["choices"][0]["text"]
    assert words.startswith("The capital")  # a text prompt is echoed as sent


def test_model_root(profile_client):
    profile, client = profile_client
    [card] = client.get("/v1/models").json()["data"]
    assert card["root"] == ("fake-model" if profile == "sglang" else "/models/fake")
    assert client.get("/v1/models/fake-model").json()["root"] == card["root"]


def test_logit_bias_names_every_bad_key(profile_client):
    _, client = profile_client
    response = client.post(CHAT, json={"messages": MESSAGES, "logit_bias": {"a": 1, "5": 2, "x y": 3, "-1": 4}})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "logit_bias"
    assert all(repr(key) in error["message"] for key in ("a", "x y", "-1")) and "'5'" not in error["message"]


def test_type_coercion(profile_client):
    """vLLM's own test sends `"logprobs": "true"`: pydantic takes it; the default profile says which field is
    wrong instead."""
    profile, client = profile_client
    response = client.post(CHAT, json={"messages": MESSAGES, "logprobs": "true", "top_logprobs": 2, "n": "2"})
    if profile == "vllm":
        body = response.json()
        assert response.status_code == 200 and len(body["choices"]) == 2
        assert len(body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    else:
        assert response.status_code == 400 and response.json()["error"]["param"] in ("logprobs", "n")
    assert client.post(CHAT, json={"messages": MESSAGES, "n": "two"}).status_code == 400  # no number in it
