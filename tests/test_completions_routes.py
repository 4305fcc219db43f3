"""/v1/completions over a recording fake engine: what reaches the engine and what comes back."""

import pytest

from tests.sse import sse_json


def test_completion_response_shape_usage_and_ids(client, fake_engine):
    response = client.post("/v1/completions", json={"model": "fake-model", "prompt": "hi"},
                           headers={"X-Request-Id": "abc123"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "abc123"
    body = response.json()
    assert body["id"] == "cmpl-abc123" and body["object"] == "text_completion" and body["model"] == "fake-model"
    assert body["choices"] == [{"index": 0, "text": "Hello world!", "logprobs": None, "finish_reason": "stop",
                                "stop_reason": None}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15}
    assert "system_fingerprint" not in body
    [call] = fake_engine.calls
    assert call.request_id == "cmpl-abc123"  # the engine request id is the response id


def test_sampling_fields_reach_the_engine(client, fake_engine):
    client.post("/v1/completions", json={
        "prompt": "hi", "max_tokens": 7, "temperature": 0.3, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2, "stop": "x",
        "stop_token_ids": [9], "seed": 42, "ignore_eos": True, "min_tokens": 2, "logprobs": 2, "user": "u1"})
    params = fake_engine.calls[0].params
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.min_p) == (7, 0.3, 0.9, 5, 0.1)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.5, 1.2)
    assert params.stop == ["x"] and params.stop_token_ids == [9] and params.seed == 42
    assert params.ignore_eos and params.min_tokens == 2 and params.logprobs == 2 and params.n == 1
    assert params.prompt_logprobs is None


def test_defaults_reach_the_engine(client, fake_engine):
    client.post("/v1/completions", json={"prompt": "hi"})
    params = fake_engine.calls[0].params
    assert params.max_tokens == 16 and params.temperature == 1.0 and params.seed is None
    assert params.output_kind.name == "FINAL_ONLY"


def test_generation_config_defaults_apply_unless_the_request_sets_them(client, fake_engine):
    fake_engine.default_sampling_params = {"temperature": 0.6, "top_p": 0.8}
    client.post("/v1/completions", json={"prompt": "hi", "top_p": 0.5})
    params = fake_engine.calls[0].params
    assert params.temperature == 0.6 and params.top_p == 0.5


@pytest.mark.parametrize("prompt, expected", [
    ("hi", [[0, 107, 108]]),
    (["a", "b"], [[0, 100], [0, 101]]),
    ([5, 6, 7], [[5, 6, 7]]),
    ([[5, 6], [7]], [[5, 6], [7]]),
])
def test_every_prompt_form(client, fake_engine, prompt, expected):
    response = client.post("/v1/completions", json={"prompt": prompt})
    assert response.status_code == 200
    assert [call.prompt.token_ids for call in fake_engine.calls] == expected
    assert [c["index"] for c in response.json()["choices"]] == list(range(len(expected)))


def test_several_prompts_get_indexed_choices_ids_and_summed_usage(client, fake_engine):
    body = client.post("/v1/completions", json={"prompt": ["a", "bb"]}, headers={"X-Request-Id": "r"}).json()
    assert sorted(call.request_id for call in fake_engine.calls) == ["cmpl-r-0", "cmpl-r-1"]
    assert body["usage"] == {"prompt_tokens": 2 + 3, "completion_tokens": 24, "total_tokens": 29}


def test_echo_with_logprobs_includes_the_prompt(client, fake_engine):
    body = client.post("/v1/completions", json={"prompt": "hi", "echo": True, "logprobs": 1, "max_tokens": 1}).json()
    choice = body["choices"][0]
    assert choice["text"] == "hiHello"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"][:3] == ["<s>", "h", "i"] and logprobs["token_logprobs"][0] is None
    assert len(logprobs["tokens"]) == len(logprobs["text_offset"]) == len(logprobs["top_logprobs"]) == 3 + 5
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
    assert fake_engine.calls[0].params.prompt_logprobs == 1


def test_echo_with_zero_max_tokens_returns_the_prompt_only(client):
    body = client.post("/v1/completions", json={"prompt": "hi", "echo": True, "max_tokens": 0}).json()
    assert body["choices"][0]["text"] == "hi" and body["usage"]["completion_tokens"] == 0


def test_stream_chunks_usage_and_one_done(client, fake_engine):
    response = client.post("/v1/completions", json={"prompt": "hi", "stream": True,
                                                    "stream_options": {"include_usage": True}})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events, done = sse_json(response.text)
    assert done == 1
    *chunks, usage = events
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello world!"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "stop"]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 12,
                                                         "total_tokens": 15}
    assert all(c["usage"] is None for c in chunks)
    assert fake_engine.calls[0].params.output_kind.name == "DELTA"


def test_stream_continuous_usage(client):
    response = client.post("/v1/completions", json={
        "prompt": "hi", "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    events, _ = sse_json(response.text)
    assert [e["usage"]["completion_tokens"] for e in events[:-1]] == [5, 11, 12]


def test_stream_without_usage_has_no_usage_chunk(client):
    events, done = sse_json(client.post("/v1/completions", json={"prompt": "hi", "stream": True}).text)
    assert done == 1 and all(e["choices"] for e in events)


def test_stream_echo_sends_the_prompt_first(client):
    events, _ = sse_json(client.post("/v1/completions", json={"prompt": "hi", "stream": True, "echo": True}).text)
    assert events[0]["choices"][0]["text"] == "hiHello"


def test_stream_logprobs_text_offset_continues_across_chunks(client):
    events, _ = sse_json(client.post("/v1/completions", json={"prompt": "hi", "stream": True, "logprobs": 0}).text)
    offsets = [o for e in events for o in e["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == list(range(12))


@pytest.mark.parametrize("body", [{}, {"prompt": None}, {"prompt": []}, {"prompt": None, "prompt_embeds": []}])
def test_a_missing_prompt_in_vllms_words(client, fake_engine, body):
    response = client.post("/v1/completions", json=body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "prompt"
    assert error["message"] == "Either prompt or prompt_embeds must be provided and non-empty."
    assert fake_engine.calls == []
