"""Compat profiles and API keys on the real server, through the OpenAI SDK (raw HTTP where it can't)."""

import httpx
import openai
import pytest

from tests.integration.server import start_server
from tests.sse import sse_json

pytestmark = pytest.mark.engine
MESSAGES = [{"role": "user", "content": "Hi"}]
KEY = "sk-choir-test"


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """A second server: the vllm profile, protected by an API key, with vLLM's hermes tool parser and
    deepseek_r1 reasoning parser, and logprobs for the whole vocabulary allowed (--max-logprobs -1)."""
    server = start_server(tmp_path_factory.mktemp("vllm") / "server.log",
                          env={"CHOIR_COMPAT": "vllm", "CHOIR_API_KEY": f"other-key,{KEY}",
                               "CHOIR_TOOL_PARSER": "hermes", "CHOIR_REASONING_PARSER": "deepseek_r1",
                               "CHOIR_ENGINE_ARGS": "--max-logprobs -1"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def vllm_client(vllm_server):
    return openai.OpenAI(base_url=f"{vllm_server.base_url}/v1", api_key=KEY, max_retries=0, timeout=60)


# The default profile (sglang), on the session's server.

def test_default_profile_sends_no_system_fingerprint(server):
    body = {"messages": MESSAGES, "max_tokens": 3}
    plain = httpx.post(f"{server.base_url}/v1/chat/completions", json=body).json()
    chunks, _ = sse_json(httpx.post(f"{server.base_url}/v1/chat/completions", json={
        **body, "stream": True, "stream_options": {"include_usage": True}}).text)
    assert not any("system_fingerprint" in obj for obj in [plain, *chunks])


def test_default_profile_every_delta_carries_reasoning_content(client, model):
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, n=2, stream=True))
    assert chunks and all(chunk.choices[0].delta.reasoning_content is None for chunk in chunks)


@pytest.mark.parametrize("field, value", [("functions", [{"name": "f", "parameters": {"type": "object"}}]),
                                          ("function_call", "auto")])
def test_default_profile_refuses_deprecated_function_fields(client, model, field, value):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, **{field: value})
    assert raised.value.body["param"] == field
    # Either message alone names both replacements.
    assert "`tools`" in raised.value.body["message"] and "`tool_choice`" in raised.value.body["message"]


def test_default_profile_unknown_model_is_400_and_names_the_served_model(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    message = raised.value.body["message"]
    assert "The model `gpt-4o` does not exist." in message and model in message


def test_models_retrieve(client, model):
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


# The vllm profile, with an API key.

def test_vllm_profile_sends_system_fingerprint(vllm_client, vllm_server):
    chat = vllm_client.chat.completions.create(model="choir-tiny", messages=MESSAGES, max_tokens=2)
    assert chat.system_fingerprint.startswith("vllm-")
    chunks = list(vllm_client.completions.create(model="choir-tiny", prompt="x", max_tokens=2, stream=True))
    assert all(chunk.system_fingerprint for chunk in chunks)


def test_vllm_profile_unknown_model_is_404(vllm_client):
    with pytest.raises(openai.NotFoundError) as raised:
        vllm_client.completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    assert raised.value.body["type"] == "NotFoundError" and raised.value.body["param"] == "model"


def test_vllm_profile_ignores_deprecated_function_fields(vllm_client):
    chat = vllm_client.chat.completions.create(model="choir-tiny", messages=MESSAGES, max_tokens=2,
                                               function_call="auto")
    assert chat.choices[0].message.role == "assistant"


def test_vllm_profile_rejects_greedy_n(vllm_client):
    with pytest.raises(openai.BadRequestError) as raised:
        vllm_client.chat.completions.create(model="choir-tiny", messages=MESSAGES, max_tokens=2, n=2, temperature=0)
    assert raised.value.body["param"] == "n"


def test_vllm_profile_deltas_have_no_reasoning_content_key(vllm_server):
    chunks, _ = sse_json(httpx.post(f"{vllm_server.base_url}/v1/chat/completions",
                                    headers={"Authorization": f"Bearer {KEY}"},
                                    json={"messages": MESSAGES, "max_tokens": 3, "stream": True}).text)
    assert not any("reasoning_content" in chunk["choices"][0]["delta"] for chunk in chunks)


@pytest.mark.parametrize("api_key", ["wrong-key", ""])
def test_a_wrong_or_missing_key_is_an_authentication_error(vllm_server, api_key):
    sdk = openai.OpenAI(base_url=f"{vllm_server.base_url}/v1", api_key=api_key or "x", max_retries=0,
                        default_headers={} if api_key else {"Authorization": ""})
    with pytest.raises(openai.AuthenticationError):
        sdk.models.list()


def test_health_stays_open_with_a_key(vllm_server):
    assert httpx.get(f"{vllm_server.base_url}/health").status_code == 200
    assert httpx.get(f"{vllm_server.base_url}/v1/models").status_code == 401


@pytest.mark.parametrize("path, body", [("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 70]})])
def test_the_tokenizer_routes_need_the_key(vllm_server, path, body):
    assert httpx.post(f"{vllm_server.base_url}{path}", json=body).status_code == 401
    authorized = httpx.post(f"{vllm_server.base_url}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert authorized.status_code == 200


def test_reasoning_parser_on_the_real_engine(vllm_client):
    """deepseek_r1 reads text before `</think>` as reasoning; the tiny model never writes the marker,
    so all of it is reasoning, in the vllm profile's `reasoning` field, streamed the same."""
    kwargs = dict(model="choir-tiny", messages=MESSAGES, max_tokens=8, seed=9, extra_body={"ignore_eos": True})
    chat = vllm_client.chat.completions.create(**kwargs)
    message = chat.choices[0].message
    assert message.reasoning and message.content is None
    assert chat.usage.completion_tokens_details.reasoning_tokens == 8
    streamed = "".join(getattr(chunk.choices[0].delta, "reasoning", None) or ""
                       for chunk in vllm_client.chat.completions.create(stream=True, **kwargs))
    assert streamed == message.reasoning


def test_auto_tool_choice_with_a_tool_parser(vllm_client):
    chat = vllm_client.chat.completions.create(
        model="choir-tiny", messages=MESSAGES, max_tokens=8, tool_choice="auto",
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    choice = chat.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls  # no call in random text


def test_minus_one_top_logprobs_under_max_logprobs_minus_one(vllm_client):
    chat = vllm_client.chat.completions.create(model="choir-tiny", messages=MESSAGES, max_tokens=2, logprobs=True,
                                               top_logprobs=-1, extra_body={"ignore_eos": True})
    positions = chat.choices[0].logprobs.content
    assert len(positions) == 2
    assert all(len(position.top_logprobs) > 700 for position in positions)  # the tiny model's whole vocabulary
    completion = vllm_client.completions.create(model="choir-tiny", prompt="x", max_tokens=1, logprobs=-1)
    # completions key the alternatives by their text: tokens that decode alike share a key
    assert len(completion.choices[0].logprobs.top_logprobs[0]) > 600


def test_vllm_profile_sends_vllms_null_fields(vllm_client):
    """vLLM's own tests read these as attributes of the SDK's objects: present, and null."""
    choice = vllm_client.completions.create(model="choir-tiny", prompt="x", max_tokens=2).choices[0]
    assert (choice.token_ids, choice.prompt_token_ids, choice.prompt_logprobs) == (None, None, None)
    chat = vllm_client.chat.completions.create(model="choir-tiny", messages=MESSAGES, max_tokens=2)
    assert (chat.prompt_token_ids, chat.prompt_logprobs, chat.choices[0].token_ids) == (None, None, None)
    chunks = list(vllm_client.completions.create(model="choir-tiny", prompt="x", max_tokens=2, stream=True))
    assert all(chunk.choices[0].token_ids is None for chunk in chunks)


def test_vllm_profile_hands_custom_roles_to_the_template(vllm_client, vllm_server):
    custom = [{"role": "my-custom-role", "content": "hi"}]
    chat = vllm_client.chat.completions.create(model="choir-tiny", messages=custom, max_tokens=2)
    tokens = httpx.post(f"{vllm_server.base_url}/tokenize", headers={"Authorization": f"Bearer {KEY}"},
                        json={"messages": custom, "return_token_strs": True}).json()
    assert chat.usage.prompt_tokens == tokens["count"] and "my" in "".join(tokens["token_strs"])


def test_vllm_profile_ends_a_cut_responses_stream_with_completed(vllm_client):
    """What the openai-agents SDK expects of vLLM: response.completed, its status incomplete."""
    events = list(vllm_client.responses.create(model="choir-tiny", input="Hi", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.status == "incomplete"


def test_vllm_profile_ignores_sglangs_fields(vllm_client, vllm_server):
    completion = vllm_client.completions.create(model="choir-tiny", prompt="x", max_tokens=8, seed=2,
                                                extra_body={"regex": "[ab]+", "rid": "zz"})
    assert not completion.id.endswith("zz") and "regex" in vllm_server.log()
