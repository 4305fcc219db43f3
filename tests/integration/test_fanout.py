"""n > 1 on the real server and engine: Choir's fan-out samples exactly what vLLM's own n would."""

import asyncio
import time

import httpx
import pytest

from tests.sse import sse_json

pytestmark = pytest.mark.engine
PROMPT_IDS = [1, 40, 41, 42, 43]
MESSAGES = [{"role": "user", "content": "Tell me three things."}]


def test_n3_with_seed_gives_three_distinct_indexed_choices(client, model):
    completion = client.completions.create(model=model, prompt=PROMPT_IDS, n=3, seed=11, max_tokens=12,
                                           extra_body={"ignore_eos": True})
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert len({c.text for c in completion.choices}) == 3
    assert completion.usage.prompt_tokens == len(PROMPT_IDS)  # the prompt counts once
    assert completion.usage.completion_tokens == 36


def test_chat_n3(client, model):
    chat = client.chat.completions.create(model=model, messages=MESSAGES, n=3, seed=5, max_tokens=6,
                                          extra_body={"ignore_eos": True})
    assert [c.index for c in chat.choices] == [0, 1, 2] and len({c.message.content for c in chat.choices}) == 3
    assert chat.usage.completion_tokens == 18


def test_streaming_n3_merges_into_one_stream_equal_to_the_non_streamed_choices(client, model):
    kwargs = dict(model=model, messages=MESSAGES, n=3, seed=21, max_tokens=10, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    texts = {i: "" for i in range(3)}
    finishes = []
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes.append(choice.index)
    assert sorted(finishes) == [0, 1, 2]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
    assert texts == {c.index: c.message.content for c in whole.choices}


def test_streaming_n3_sse_has_one_usage_chunk_and_one_done(server):
    response = httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={
        "prompt": PROMPT_IDS, "n": 3, "seed": 1, "max_tokens": 8, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True}})
    events, done = sse_json(response.text)
    assert done == 1 and sum(1 for e in events if not e["choices"]) == 1
    assert sum(1 for e in events if e["choices"] and e["choices"][0]["finish_reason"]) == 3


def test_fan_out_equals_the_engines_own_parallel_sampling(client, model, direct_engine):
    """Same prompt, same seed: Choir's n children give the texts of vLLM's SamplingParams(n=3, seed=s)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    ours = client.completions.create(model=model, prompt=PROMPT_IDS, n=3, seed=1234, max_tokens=12,
                                     temperature=1.0, extra_body={"ignore_eos": True})

    async def native():
        params = SamplingParams(n=3, seed=1234, max_tokens=12, temperature=1.0, ignore_eos=True,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        last = None
        async for output in direct_engine.generate({"prompt_token_ids": PROMPT_IDS}, params, "native-n3"):
            last = output
        return [o.text for o in sorted(last.outputs, key=lambda o: o.index)]

    assert [c.text for c in ours.choices] == asyncio.run_coroutine_threadsafe(native(), direct_engine.loop).result(120)


def test_disconnect_mid_stream_aborts_every_child_in_the_engine(server):
    body = {"prompt": PROMPT_IDS, "n": 4, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.base_url}/v1/completions", json=body) as response:
            # Keep the line iterator alive: dropping it would already close the connection.
            lines = response.iter_lines()
            seen = 0
            while seen < 8:
                seen += next(lines).startswith("data: ")
            assert http.get(f"{server.base_url}/health").json()["unfinished_requests"] == 4
            response.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        if httpx.get(f"{server.base_url}/health").json()["unfinished_requests"] == 0:
            break
        time.sleep(0.05)
    assert httpx.get(f"{server.base_url}/health").json()["unfinished_requests"] == 0


def engine_gauge(server, name: str) -> float:
    """One of vLLM's gauges from /metrics (summed over its label sets)."""
    lines = httpx.get(f"{server.base_url}/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{") or
               line.startswith(name + " "))


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT_IDS, "n": 4, "max_tokens": 1500, "ignore_eos": True}),
    ("/v1/chat/completions", {"messages": MESSAGES, "n": 4, "max_tokens": 1500, "ignore_eos": True}),
])
def test_disconnect_from_a_whole_request_aborts_every_child_at_once(server, path, body):
    """Not streamed: nothing is written until the end, yet the engine must stop when the client goes."""
    import json
    import socket

    host, port = server.base_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        server.wait_for_unfinished(4)
        deadline = time.monotonic() + 30
        while engine_gauge(server, "vllm:num_requests_running") < 4:  # decoding, not only queued
            assert time.monotonic() < deadline
            time.sleep(0.05)
    closed = time.monotonic()
    while engine_gauge(server, "vllm:num_requests_running") > 0 or \
            httpx.get(f"{server.base_url}/health").json()["unfinished_requests"] > 0:
        assert time.monotonic() - closed < 2.0, "the engine still runs the children of a request nobody reads"
        time.sleep(0.05)
    assert client_is_served(server)


def client_is_served(server) -> bool:
    reply = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
    return reply.status_code == 200
