"""The official OpenAI SDK against the real server over the real vLLM engine (bundled tiny model)."""

import httpx
import openai
import pytest

from choir.core.settings import BUNDLED_MODEL_NAME

pytestmark = pytest.mark.engine
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


def test_models_list(client):
    [card] = client.models.list().data
    assert card.id == BUNDLED_MODEL_NAME and card.object == "model"
    assert card.root == BUNDLED_MODEL_NAME and card.max_model_len == 2048  # the sglang profile's root


def test_completion(client, model):
    completion = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=8,
                                           extra_body={"ignore_eos": True})
    assert completion.id.startswith("cmpl-") and completion.object == "text_completion"
    [choice] = completion.choices
    assert choice.text and choice.finish_reason == "length"
    assert completion.usage.completion_tokens == 8
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 8


def test_completion_stream(client, model):
    chunks = list(client.completions.create(model=model, prompt="Once upon a time", max_tokens=10, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    *content, usage = chunks
    assert usage.choices == [] and usage.usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in content].count("length") == 1
    assert "".join(c.choices[0].text for c in content)


def test_same_seed_same_text(client, model):
    def sample(seed):
        return client.completions.create(model=model, prompt="Tell me", max_tokens=12, seed=seed,
                                         temperature=1.0, extra_body={"ignore_eos": True}).choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(7), sample(8), sample(9)}) > 1


def test_streamed_text_equals_non_streamed_text_for_a_seed(client, model):
    kwargs = dict(model=model, prompt="A seeded story", max_tokens=12, seed=3, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs))
    assert streamed == whole


def test_completion_echo_and_logprobs(client, model):
    prompt = "Echo this"
    completion = client.completions.create(model=model, prompt=prompt, max_tokens=4, echo=True, logprobs=2,
                                           extra_body={"ignore_eos": True})
    choice = completion.choices[0]
    assert choice.text.startswith(prompt)
    logprobs = choice.logprobs
    n_tokens = completion.usage.prompt_tokens + 4
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == n_tokens
    assert logprobs.token_logprobs[0] is None and all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(top is None or 1 <= len(top) <= 3 for top in logprobs.top_logprobs)


def test_completion_stop_string(client, model):
    base = client.completions.create(model=model, prompt="Stop here", max_tokens=16, seed=1,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[3:5]
    assert stop.strip()
    stopped = client.completions.create(model=model, prompt="Stop here", max_tokens=16, seed=1, stop=[stop],
                                        extra_body={"ignore_eos": True}).choices[0]
    assert stopped.finish_reason == "stop" and stop not in stopped.text and base.startswith(stopped.text)


def test_completion_token_id_prompts(client, model):
    completion = client.completions.create(model=model, prompt=[[1, 40, 41], [1, 50]], max_tokens=3,
                                           extra_body={"ignore_eos": True})
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.usage.prompt_tokens == 5 and completion.usage.completion_tokens == 6


def test_chat(client, model):
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8,
                                          extra_body={"ignore_eos": True})
    assert chat.id.startswith("chatcmpl-") and chat.object == "chat.completion"
    message = chat.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 8


def test_chat_stream(client, model):
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    role, *content, usage = chunks
    assert role.choices[0].delta.role == "assistant"
    assert sum(c.choices[0].finish_reason is not None for c in content) == 1
    assert usage.usage.completion_tokens == 8


def test_chat_logprobs(client, model):
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, logprobs=True,
                                          top_logprobs=3, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 5
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        assert token.top_logprobs[0].logprob >= token.top_logprobs[-1].logprob
    assert "".join(t.token for t in content) == chat.choices[0].message.content


def test_chat_stream_logprobs(client, model):
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, logprobs=True,
                                                 top_logprobs=2, stream=True, extra_body={"ignore_eos": True}))
    tokens = [t for c in chunks[1:] if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert len(tokens) == 5 and all(len(t.top_logprobs) == 2 for t in tokens)


def test_request_id_header_is_the_response_id(server):
    response = httpx.post(f"{server.base_url}/v1/completions", headers={"X-Request-Id": "trace-42"},
                          json={"prompt": "hi", "max_tokens": 2})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "trace-42" and response.json()["id"] == "cmpl-trace-42"


def test_unknown_model_is_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert raised.value.body["param"] == "model" and "gpt-4" in raised.value.body["message"]


def test_prompt_longer_than_the_context(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=model, prompt=[[5] * 2100], max_tokens=2)
    assert "maximum context length is 2048" in raised.value.body["message"]


def test_max_tokens_over_the_context(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5000)
    assert raised.value.body["param"] == "max_tokens"


def test_invalid_sampling_value(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=MESSAGES, temperature=-1)
    assert raised.value.body["param"] == "temperature"


def test_out_of_vocabulary_token_is_a_bad_request_even_when_streaming(client, model):
    with pytest.raises(openai.BadRequestError):
        list(client.completions.create(model=model, prompt=[[10**7]], max_tokens=2, stream=True))


def test_too_many_logprobs_is_a_bad_request(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=model, prompt="x", max_tokens=2, logprobs=50)
    assert "logprobs" in raised.value.body["message"]


def test_unknown_route_and_method(server):
    assert httpx.get(f"{server.base_url}/v1/nothing").json()["error"]["code"] == 404
    assert httpx.put(f"{server.base_url}/v1/models").json()["error"]["code"] == 405


def test_server_still_serves_after_errors(client, model):
    assert client.completions.create(model=model, prompt="still here", max_tokens=2).choices[0].text is not None


def test_metrics_expose_vllms_engine_metrics_and_choirs(server, client, model):
    client.completions.create(model=model, prompt="count me", max_tokens=2)
    text = httpx.get(f"{server.base_url}/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                 'choir_requests_total{method="POST",route="createCompletion",status="200"}',
                 "choir_request_duration_seconds_bucket"):
        assert name in text, name


def test_chat_continuous_usage_from_the_first_chunk(client, model):
    chunks = list(client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=4, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    prompt = chunks[-1].usage.prompt_tokens
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (chunks[0].usage.prompt_tokens, chunks[0].usage.completion_tokens) == (prompt, 0)
    assert chunks[-1].usage.completion_tokens == 4 and all(c.usage is not None for c in chunks)


def test_files_through_the_sdk(client):
    """The OpenAI SDK's Files calls, as the Batch API uses them: upload, describe, list, read back, delete."""
    lines = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    uploaded = client.files.create(file=("in.jsonl", lines), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(lines) and uploaded.filename == "in.jsonl"
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert uploaded.id in [f.id for f in client.files.list(purpose="batch")]
    assert client.files.content(uploaded.id).content == lines
    assert client.files.delete(uploaded.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("in.jsonl", lines), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"


def test_a_batch_through_the_sdk(client, model):
    """OpenAI's batch calls, as its SDK makes them: a file of requests uploaded, a batch made and polled, its output
    and error files read; each line answered as the same request sent live (seeded: the same tokens)."""
    import json
    import time

    def line(custom_id, **body):
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                           "body": {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                    "seed": 7, **body}})

    content = "\n".join([line("a"), line("b", n=2), line("c", model="not-served")]).encode()
    uploaded = client.files.create(file=("batch.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    assert batch.status == "completed" and batch.request_counts.total == 3
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    outputs = [json.loads(text) for text in client.files.content(batch.output_file_id).text.splitlines()]
    assert [output["custom_id"] for output in outputs] == ["a", "b"]
    live = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          seed=7)
    assert outputs[0]["response"]["body"]["choices"][0]["message"]["content"] == live.choices[0].message.content
    [error] = [json.loads(text) for text in client.files.content(batch.error_file_id).text.splitlines()]
    assert error["custom_id"] == "c" and error["response"]["status_code"] == 400
    assert batch.id in [listed.id for listed in client.batches.list()]
    bad = client.files.create(file=("bad.jsonl", b"{not json\n"), purpose="batch")
    failed = client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
    while (failed := client.batches.retrieve(failed.id)).status == "validating":
        time.sleep(0.1)
    assert failed.status == "failed" and failed.errors.data[0].line == 1
