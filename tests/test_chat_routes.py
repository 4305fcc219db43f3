"""/v1/chat/completions over a recording fake engine."""

import pytest

from tests.sse import sse_json

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_chat_response_shape_and_template(client, fake_engine):
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES}, headers={"X-Request-Id": "q"})
    assert response.status_code == 200 and response.headers["x-request-id"] == "q"
    body = response.json()
    assert body["id"] == "chatcmpl-q" and body["object"] == "chat.completion"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello world!"},
                                "logprobs": None, "finish_reason": "stop", "stop_reason": None}]
    [call] = fake_engine.calls
    assert call.request_id == "chatcmpl-q"
    assert call.prompt.text == "<system>be brief<user>hi<assistant>"
    prompt_tokens = len(call.prompt.token_ids)
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 12,
                             "total_tokens": prompt_tokens + 12}


def test_chat_max_tokens_default_is_the_remaining_context(client, fake_engine):
    client.post("/v1/chat/completions", json={"messages": MESSAGES})
    call = fake_engine.calls[0]
    assert call.params.max_tokens == fake_engine.max_model_len - len(call.prompt.token_ids)


def test_max_completion_tokens_wins_over_max_tokens(client, fake_engine):
    client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 9, "max_completion_tokens": 3})
    assert fake_engine.calls[0].params.max_tokens == 3


def test_add_generation_prompt_false(client, fake_engine):
    client.post("/v1/chat/completions", json={"messages": MESSAGES, "add_generation_prompt": False})
    assert not fake_engine.calls[0].prompt.text.endswith("<assistant>")


def test_chat_logprobs_shape(client, fake_engine):
    body = client.post("/v1/chat/completions", json={"messages": MESSAGES, "logprobs": True,
                                                     "top_logprobs": 2}).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert "".join(t["token"] for t in content) == "Hello world!"
    assert all(len(t["top_logprobs"]) == 2 and t["bytes"] == list(t["token"].encode()) for t in content)
    assert fake_engine.calls[0].params.logprobs == 2


def test_chat_stream_role_content_finish_usage_done(client):
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True,
                                                         "stream_options": {"include_usage": True}})
    events, done = sse_json(response.text)
    assert done == 1
    role, *content, usage = events
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": "", "reasoning_content": None}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in content) == "Hello world!"
    assert [c["choices"][0]["finish_reason"] for c in content][-1] == "stop"
    assert sum(c["choices"][0]["finish_reason"] is not None for c in content) == 1
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12


def test_chat_stream_logprobs(client):
    events, _ = sse_json(client.post("/v1/chat/completions", json={
        "messages": MESSAGES, "stream": True, "logprobs": True, "top_logprobs": 1}).text)
    tokens = [t["token"] for e in events[1:] for t in e["choices"][0]["logprobs"]["content"]]
    assert "".join(tokens) == "Hello world!"


@pytest.mark.parametrize("extra", [{}, {"return_token_ids": True}])
def test_chat_stream_continuous_usage_starts_with_the_prompt(client, extra):
    """vLLM's role chunk says the prompt's tokens and none generated; every later chunk its choice's count."""
    events, _ = sse_json(client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 2, **extra,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}).text)
    prompt = events[-1]["usage"]["prompt_tokens"]
    roles = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("role")]
    assert len(roles) == 2
    assert all(e["usage"] == {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt} for e in roles)
    for index in (0, 1):
        counts = [e["usage"]["completion_tokens"] for e in events if e["choices"] and e["choices"][0]["index"] == index]
        assert counts == [0, 5, 11, 12]
    assert events[-1]["usage"]["completion_tokens"] == 24
