"""Fan-out and aggregation over a recording fake engine: child ids, seeds and params that reach the
engine, and the index/usage/finish/[DONE] rules of the merged response or stream."""

import asyncio

import pytest

from choir.core.errors import EngineRejected
from choir.engine.protocol import NO_OPTIONS
from choir.engine.roles import Engines
from tests.sse import sse_json

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def by_request_id(engine):
    return {call.request_id: call for call in engine.calls}


def test_non_stream_chat_completions_fans_out_choice_request_ids_and_seeds(client, fake_engine):
    body = client.post(CHAT, json={"messages": MESSAGES, "n": 3, "seed": 10}, headers={"X-Request-Id": "p"}).json()
    calls = by_request_id(fake_engine)
    assert set(calls) == {"0_chatcmpl-p", "1_chatcmpl-p", "2_chatcmpl-p"}
    assert [calls[f"{i}_chatcmpl-p"].params.seed for i in range(3)] == [10, 11, 12]
    assert all(call.params.n == 1 for call in calls.values())
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    prompt_tokens = len(fake_engine.calls[0].prompt.token_ids)
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 36,
                             "total_tokens": prompt_tokens + 36}


def test_stream_chat_completions_fans_out_choice_request_ids_and_seeds(client, fake_engine):
    client.post(CHAT, json={"messages": MESSAGES, "n": 2, "seed": 5, "stream": True}, headers={"X-Request-Id": "s"})
    calls = by_request_id(fake_engine)
    assert {rid: call.params.seed for rid, call in calls.items()} == {"0_chatcmpl-s": 5, "1_chatcmpl-s": 6}


def test_non_stream_completions_fans_out_choice_request_ids_and_seeds(client, fake_engine):
    client.post("/v1/completions", json={"prompt": "x", "n": 2, "seed": 0}, headers={"X-Request-Id": "c"})
    assert {r: c.params.seed for r, c in by_request_id(fake_engine).items()} == {"0_cmpl-c": 0, "1_cmpl-c": 1}


def test_unseeded_children_stay_unseeded(client, fake_engine):
    client.post(CHAT, json={"messages": MESSAGES, "n": 3})
    assert [call.params.seed for call in fake_engine.calls] == [None, None, None]


def test_n_equal_one_keeps_the_parent_id(client, fake_engine):
    client.post(CHAT, json={"messages": MESSAGES, "n": 1, "seed": 4}, headers={"X-Request-Id": "one"})
    [call] = fake_engine.calls
    assert call.request_id == "chatcmpl-one" and call.params.seed == 4


def test_every_other_sampling_field_reaches_every_child_unchanged(client, fake_engine):
    client.post("/v1/completions", json={"prompt": "x", "n": 3, "seed": 1, "temperature": 0.7, "top_p": 0.9,
                                         "top_k": 4, "stop": ["q"], "max_tokens": 5, "logprobs": 1})
    import msgspec

    def fields(params):
        return {k: v for k, v in msgspec.structs.asdict(params).items() if k != "seed"}

    first, *rest = fake_engine.calls
    assert all(fields(call.params) == fields(first.params) for call in rest)
    assert first.params.temperature == 0.7 and first.params.stop == ["q"] and first.params.max_tokens == 5


def test_multi_prompt_completions_index_prompt_times_n_plus_i(client, fake_engine):
    fake_engine.script = lambda prompt, params: [f"{prompt[-1]}{params.seed}"]
    body = client.post("/v1/completions", json={"prompt": ["a", "bb"], "n": 2, "seed": 7},
                       headers={"X-Request-Id": "m"}).json()
    assert sorted(by_request_id(fake_engine)) == ["0_cmpl-m-0", "0_cmpl-m-1", "1_cmpl-m-0", "1_cmpl-m-1"]
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "a7"), (1, "a8"), (2, "b7"), (3, "b8")]
    assert body["usage"]["prompt_tokens"] == 2 + 3  # each prompt once, not n times
    assert body["usage"]["completion_tokens"] == 4 * 2


def test_greedy_n_gives_n_choices(client):
    body = client.post(CHAT, json={"messages": MESSAGES, "n": 4, "temperature": 0}).json()
    assert len(body["choices"]) == 4


def test_stream_n_merges_into_one_stream(client, fake_engine):
    response = client.post(CHAT, json={"messages": MESSAGES, "n": 3, "stream": True,
                                       "stream_options": {"include_usage": True}})
    events, done = sse_json(response.text)
    assert done == 1
    *chunks, usage = events
    assert all(len(e["choices"]) == 1 for e in chunks)
    for index in range(3):
        mine = [e["choices"][0] for e in chunks if e["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": "", "reasoning_content": None}  # role first
        assert "".join(c["delta"].get("content", "") for c in mine) == "Hello world!"
        assert sum(c["finish_reason"] is not None for c in mine) == 1 and mine[-1]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 36
    assert sum(1 for e in events if not e["choices"]) == 1


def test_stream_chunks_of_children_interleave(client, fake_engine):
    fake_engine.delay = 0.001
    events, _ = sse_json(client.post(CHAT, json={"messages": MESSAGES, "n": 2, "stream": True}).text)
    order = [e["choices"][0]["index"] for e in events]
    assert order != sorted(order)  # merged as they arrive, no child buffered whole


def test_stream_multi_prompt_completions_indices_and_continuous_usage(client, fake_engine):
    events, done = sse_json(client.post("/v1/completions", json={
        "prompt": ["a", "bb"], "n": 2, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}).text)
    *chunks, usage = events
    assert {e["choices"][0]["index"] for e in chunks} == {0, 1, 2, 3}
    finishes = [e["choices"][0]["index"] for e in chunks if e["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1, 2, 3]
    last = {e["choices"][0]["index"]: e["usage"] for e in chunks}
    assert last[0]["prompt_tokens"] == 2 and last[2]["prompt_tokens"] == 3
    assert all(u["completion_tokens"] == 12 for u in last.values())
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 48, "total_tokens": 53}


def test_a_failing_child_fails_the_response_and_aborts_its_siblings(client, fake_engine):
    original = fake_engine.generate
    fake_engine.delay = 0.01

    async def generate(prompt, params, request_id, options=NO_OPTIONS):
        if request_id.startswith("1_"):
            await asyncio.sleep(0.005)
            raise EngineRejected("child 1 is invalid")
        async for output in original(prompt, params, request_id, options):
            yield output

    fake_engine.generate = generate
    response = client.post(CHAT, json={"messages": MESSAGES, "n": 3})
    assert response.status_code == 400 and "child 1" in response.json()["error"]["message"]
    assert sorted(fake_engine.aborted) == ["0_" + fake_engine.calls[0].request_id[2:],
                                           "2_" + fake_engine.calls[0].request_id[2:]]


def test_a_failing_child_mid_stream_is_one_error_event_then_done(client, fake_engine):
    original = fake_engine.generate
    fake_engine.delay = 0.01

    async def generate(prompt, params, request_id, options=NO_OPTIONS):
        count = 0
        async for output in original(prompt, params, request_id, options):
            yield output
            count += 1
            if request_id.startswith("1_") and count == 2:
                raise EngineRejected("child 1 broke")

    fake_engine.generate = generate
    response = client.post(CHAT, json={"messages": MESSAGES, "n": 3, "stream": True})
    events, done = sse_json(response.text)
    assert done == 1 and [e for e in events if "error" in e] == [events[-1]]
    assert "child 1 broke" in events[-1]["error"]["message"]
    siblings = {call.request_id for call in fake_engine.calls if not call.request_id.startswith("1_")}
    assert siblings <= set(fake_engine.aborted) and not fake_engine.running


@pytest.mark.parametrize("n", [1, 3])
async def test_closing_the_stream_early_aborts_every_child(n):
    """What Litestar does when the client disconnects: the SSE body iterator is closed mid-stream.
    (The in-process test client cannot disconnect; tests/integration checks this on a real server.)"""
    from choir.app.serving.chat import plan_chat, stream_chat
    from choir.app.serving.counts import TokenCounts
    from choir.core.compat import OperationCompat
    from choir.core.protocol.chat import ChatCompletionRequest
    from choir.plugins.aggregation import Aggregator
    from choir.plugins.fanout import FanOut
    from choir.plugins.pipeline import Pipeline
    from tests.fakes import FakeEngine

    engine = FakeEngine(script=lambda prompt, params: ["tok"] * 50, delay=0.01, max_model_len=200)
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], n=n, stream=True)
    pipeline = Pipeline(OperationCompat(), FanOut(), engine, Aggregator(engine), Engines({"generate": engine}))
    job = await plan_chat(pipeline, msgspec_convert(request), "chatcmpl-x", 0)
    events = stream_chat(Aggregator(engine), job, TokenCounts())
    for _ in range(3):
        await anext(events)
    assert len(engine.running) == n
    await events.aclose()
    assert sorted(engine.aborted) == sorted(choice.request_id for choice in job.choices)
    assert not engine.running


def msgspec_convert(request):
    import msgspec

    return msgspec.convert(msgspec.to_builtins(request), type(request))
