"""Choir as a replica behind the routers the field runs: two replicas on loopback sharing one store (PostgreSQL under
`make test`), vLLM's router (`vllm-router`) and SGLang's gateway (`smg`) in front, under every policy that needs
nothing but HTTP, and vLLM's router's `kv_aware` on the engines' own KV-cache events. Through each: chat, an
`n > 1` stream, embeddings, a Responses chain continued on whichever replica the router picks, a stored response
read back, a conversation and a background response, the Messages API. Embeddings through vLLM's router only:
SGLang's gateway registers one model per worker."""

import json
import time
from dataclasses import dataclass

import anthropic
import pytest
from openai import OpenAI

from choir.core.settings import bundled_model_dir
from tests.databases import postgres_or_none
from tests.integration.routers import start_router
from tests.integration.server import ROOT, Server, free_port, start_server

pytestmark = pytest.mark.engine

# Every policy that routes on HTTP alone (manual: a header's worker), and kv_aware on the engines' KV events.
ROUTERS = [*(("vllm-router", policy) for policy in ("round_robin", "random", "power_of_two", "cache_aware",
                                                     "consistent_hash", "kv_aware")),
           *(("smg", policy) for policy in ("round_robin", "random", "power_of_two", "cache_aware", "least_load",
                                            "consistent_hashing", "prefix_hash"))]
BLOCK = 32  # the KV block size: vLLM's CPU build takes multiples of 32, vLLM's router assumes 16 unless told


@dataclass
class Replica:
    server: Server
    events: str  # where its engine publishes KV-cache events (ZMQ, bound on the replica's side)

    @property
    def base_url(self) -> str:
        return self.server.base_url


@pytest.fixture(scope="module")
def replicas(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("replicas")
    store = postgres_or_none(request) or f"sqlite+aiosqlite:///{directory / 'store.sqlite3'}"
    started: list[Replica] = []
    try:
        for index in range(2):  # one core each
            port = free_port()
            events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}",
                      "topic": "kv"}
            server = start_server(directory / f"replica{index}.log", {
                "CHOIR_STORE_URL": store, "VLLM_CPU_OMP_THREADS_BIND": str(index),
                "CHOIR_EMBEDDING_MODEL": str(bundled_model_dir("embed")), "PYTHONHASHSEED": "0",
                "CHOIR_ENGINE_ARGS": f"--kv-events-config '{json.dumps(events)}' --block-size {BLOCK}"})
            started.append(Replica(server, f"tcp://127.0.0.1:{port}"))
        yield started
    finally:
        for replica in started:
            replica.server.stop()


def kv_aware_flags(replicas: list[Replica]) -> list[str]:
    """Each replica's event source, as vLLM's router documents them (it would otherwise ask the replica for
    SGLang's /get_server_info, which `vllm serve` lacks too)."""
    flags = [flag for replica in replicas for flag in ("--kv-event-source", f"{replica.base_url}={replica.events}")]
    return [*flags, "--kv-event-block-size", str(BLOCK), "--kv-event-model", "choir-tiny"]


@pytest.fixture(scope="module", params=ROUTERS, ids=[f"{program}-{policy}" for program, policy in ROUTERS])
def router(request, replicas, tmp_path_factory):
    program, policy = request.param
    kv = policy == "kv_aware"
    started = start_router(program, policy, [r.base_url for r in replicas],
                           tmp_path_factory.mktemp("router") / f"{program}.log",
                           kv_aware_flags(replicas) if kv else (),
                           {"VLLM_ROUTER_TOKENIZER": str(ROOT / "models" / "choir-tiny")} if kv else None)
    try:
        deadline = time.monotonic() + 10
        while kv and not all(f"subscriber for {replica.base_url} rank0 on {replica.events}" in started.log()
                             for replica in replicas):  # it subscribed to both replicas' events
            assert time.monotonic() < deadline, started.log()[-3000:]
            time.sleep(0.2)
        yield program, started.base_url
    finally:
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
