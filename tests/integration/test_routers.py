"""Choir as a replica behind the routers the field runs: two replicas on loopback sharing one store (PostgreSQL under
`make test`), vLLM's router (`vllm-router`) and SGLang's gateway (`smg`) in front, under every policy that needs
nothing but HTTP. Through each: chat, an `n > 1` stream, embeddings, a Responses chain continued on whichever
replica the router picks, a stored response read back, a conversation and a background response, the Messages API.
Embeddings through vLLM's router only: SGLang's gateway registers one model per worker."""

import time

import anthropic
import pytest
from openai import OpenAI

from choir.core.settings import bundled_model_dir
from tests.databases import postgres_or_none
from tests.integration.routers import start_router
from tests.integration.server import start_server

pytestmark = pytest.mark.engine

# The policies that route on HTTP alone (kv_aware needs the engines' KV events; manual, a header's worker).
ROUTERS = [*(("vllm-router", policy) for policy in ("round_robin", "random", "power_of_two", "cache_aware",
                                                     "consistent_hash")),
           *(("smg", policy) for policy in ("round_robin", "random", "power_of_two", "cache_aware", "least_load",
                                            "consistent_hashing", "prefix_hash"))]


@pytest.fixture(scope="module")
def replicas(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("replicas")
    store = postgres_or_none(request) or f"sqlite+aiosqlite:///{directory / 'store.sqlite3'}"
    started = []
    try:
        for index in range(2):  # one core each
            started.append(start_server(directory / f"replica{index}.log", {
                "CHOIR_STORE_URL": store, "VLLM_CPU_OMP_THREADS_BIND": str(index),
                "CHOIR_EMBEDDING_MODEL": str(bundled_model_dir("embed"))}))
        yield started
    finally:
        for replica in started:
            replica.stop()


@pytest.fixture(scope="module", params=ROUTERS, ids=[f"{program}-{policy}" for program, policy in ROUTERS])
def router(request, replicas, tmp_path_factory):
    program, policy = request.param
    started = start_router(program, policy, [r.base_url for r in replicas],
                           tmp_path_factory.mktemp("router") / f"{program}.log")
    yield program, started.base_url
    started.stop()


def test_generation_and_embeddings_pass_through(router):
    program, base = router
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(model="choir-tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4)
    assert chat.choices[0].finish_reason in ("length", "stop") and chat.usage.completion_tokens >= 1
    chunks = list(client.completions.create(model="choir-tiny", prompt="a", n=2, max_tokens=4, stream=True,
                                            stream_options={"include_usage": True}))
    assert {choice.index for chunk in chunks for choice in chunk.choices} == {0, 1}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    if program == "vllm-router":  # SGLang's gateway registers one model per worker, the first /v1/models lists
        assert len(client.embeddings.create(model="choir-tiny-embed", input=["a", "b"]).data) == 2


def test_stored_state_continues_on_either_replica(router, replicas):
    program, base = router
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    first = client.responses.create(model="choir-tiny", input="hi", max_output_tokens=4)
    if program == "smg":
        # SGLang's gateway answers stored responses and conversations from a store of its own (none with
        # --history-backend none): the deployment that works sends those routes past it, to any replica.
        client = OpenAI(base_url=f"{replicas[1].base_url}/v1", api_key="unused", max_retries=0)
    turns = [first]
    for _ in range(3):  # the router spreads the turns; each finds the one before in the shared store
        turns.append(client.responses.create(model="choir-tiny", input="more", previous_response_id=turns[-1].id,
                                             max_output_tokens=4))
    assert turns[-1].status in ("completed", "incomplete")
    for turn in turns:
        assert client.responses.retrieve(turn.id).id == turn.id
    assert len(client.responses.input_items.list(turns[-1].id).data) == 1
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "hi"}])
    client.responses.create(model="choir-tiny", conversation=conversation.id, input="go on", max_output_tokens=4)
    assert len(client.conversations.items.list(conversation.id).data) >= 3
    background = client.responses.create(model="choir-tiny", input="hi", max_output_tokens=4, background=True)
    deadline = time.monotonic() + 60
    while (state := client.responses.retrieve(background.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert state.status in ("completed", "incomplete")


def test_the_messages_api_passes_through(router):
    client = anthropic.Anthropic(base_url=router[1], api_key="unused", max_retries=0)
    message = client.messages.create(model="choir-tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert message.id.startswith("msg_") and message.stop_reason in ("max_tokens", "end_turn")
