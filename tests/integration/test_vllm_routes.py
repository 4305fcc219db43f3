"""vLLM's batched chat and SageMaker's /invocations on the real engine (raw HTTP: the SDK has neither)."""

import httpx
import pytest

pytestmark = pytest.mark.engine


def test_batched_chat_answers_each_conversation(server, model):
    conversations = [[{"role": "user", "content": "One"}], [{"role": "user", "content": "Two, longer"}],
                     [{"role": "system", "content": "Brief."}, {"role": "user", "content": "Three"}]]
    body = httpx.post(f"{server.base_url}/v1/chat/completions/batch", timeout=120,
                      json={"model": model, "messages": conversations, "max_tokens": 4, "seed": 1,
                            "ignore_eos": True}).json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2]
    prompts = [httpx.post(f"{server.base_url}/tokenize", json={"messages": c}).json()["count"] for c in conversations]
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == \
        (sum(prompts), 12, sum(prompts) + 12)
    single = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={
        "model": model, "messages": conversations[1], "max_tokens": 4, "seed": 1, "ignore_eos": True}).json()
    assert body["choices"][1]["message"]["content"] == single["choices"][0]["message"]["content"]
    refused = httpx.post(f"{server.base_url}/v1/chat/completions/batch", json={"messages": conversations, "n": 2})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"


@pytest.mark.parametrize("body, kind", [({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                                         "chat.completion"), ({"prompt": "Hi", "max_tokens": 2}, "text_completion")])
def test_invocations(server, body, kind):
    answer = httpx.post(f"{server.base_url}/invocations", json=body, timeout=120)
    assert answer.status_code == 200 and answer.json()["object"] == kind
    streamed = httpx.post(f"{server.base_url}/invocations", json={**body, "stream": True}, timeout=120)
    assert streamed.headers["content-type"].startswith("text/event-stream") and "data: [DONE]" in streamed.text
    unknown = httpx.post(f"{server.base_url}/invocations", json={"query": "Hi"})
    assert unknown.status_code == 400
