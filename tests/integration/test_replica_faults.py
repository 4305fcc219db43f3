"""Faults in a fleet: two Choir replicas behind vLLM's router, sharing a PostgreSQL cluster of this module's own.

- The store goes away (the cluster stopped as a crash stops it) while both replicas serve: what needs it is a 503 in
  OpenAI's shape, what does not is served as before; a background response being made meanwhile ends, and its end
  is stored once the store is back; nothing stored before is lost; no replica is restarted.
- A replica's engine dies mid-stream: its stream ends with an error event, the other replica's stream ends well,
  and the router (its health checks and retries; no circuit breaker, see ROUTER_FLAGS) sends what comes next to
  the live one; the replica restarted on its port rejoins."""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from tests.databases import Cluster, throwaway_cluster
from tests.integration.routers import Router, start_router
from tests.integration.server import Server, Streams, start_server
from tests.sse import sse_json, sse_payloads

pytestmark = pytest.mark.engine

MODEL = "choir-tiny"
# Health checked every second, one failure enough to leave a worker out; a 5xx retried on another worker. No circuit
# breaker: it counts every 5xx against the worker that sent it, so the store's 503s (the same on every replica)
# would leave both out, and what needs no store with them (docs/deploying.md).
ROUTER_FLAGS = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                "--health-success-threshold", "1", "--retry-max-retries", "3", "--retry-initial-backoff-ms", "50",
                "--disable-circuit-breaker"]


@dataclass
class Fleet:
    replicas: list[Server]
    router: Router
    environment: Callable[[int], dict[str, str]]
    directory: Path

    def client(self) -> OpenAI:
        return OpenAI(base_url=f"{self.router.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def cluster():
    with throwaway_cluster(durable=True) as started:  # what it acknowledged outlives a crash
        yield started


@pytest.fixture(scope="module")
def fleet(cluster: Cluster, tmp_path_factory):
    directory = tmp_path_factory.mktemp("fleet")
    store = cluster.new_database()

    def environment(index: int) -> dict[str, str]:
        return {"CHOIR_STORE_URL": store, "VLLM_CPU_OMP_THREADS_BIND": str(index)}  # one core each

    replicas: list[Server] = []
    router = None
    try:
        for index in range(2):
            replicas.append(start_server(directory / f"replica{index}.log", environment(index)))
        router = start_router("vllm-router", "round_robin", [r.base_url for r in replicas],
                              directory / "router.log", ROUTER_FLAGS)
        yield Fleet(replicas, router, environment, directory)
    finally:
        if router is not None:
            router.stop()
        for replica in replicas:
            if replica.process.poll() is None:
                replica.stop()


def unfinished(client: OpenAI, response_id: str) -> bool:
    return client.responses.retrieve(response_id).status in ("queued", "in_progress")


def test_the_store_going_away_costs_the_stateful_calls_a_503_and_nothing_more(fleet: Fleet, cluster: Cluster):
    client = fleet.client()
    kept = client.responses.create(model=MODEL, input="hi", max_output_tokens=4)
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "hi"}])
    background = client.responses.create(model=MODEL, input="tell", max_output_tokens=400, background=True)
    deadline = time.monotonic() + 30
    while (status := client.responses.retrieve(background.id).status) == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert status == "in_progress"  # 400 tokens take seconds more

    cluster.halt()
    stateful = (lambda: client.responses.retrieve(kept.id),
                lambda: client.responses.create(model=MODEL, input="x", max_output_tokens=2),
                lambda: client.responses.create(model=MODEL, input="x", previous_response_id=kept.id,
                                                max_output_tokens=2),
                lambda: client.conversations.create(),
                lambda: client.conversations.items.list(conversation.id))
    for call in stateful:
        with pytest.raises(openai.APIStatusError) as raised:
            call()
        error = raised.value.response.json()["error"]
        assert raised.value.status_code == 503 and "store" in error["message"], error
    # What needs no store is served as before, on both replicas (round robin).
    for _ in range(2):
        assert client.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False).status
        chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat.choices[0].finish_reason in ("length", "stop")
        message = anthropic.Anthropic(base_url=fleet.router.base_url, api_key="unused", max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert message.stop_reason in ("max_tokens", "end_turn")

    # The background response's generation ends during the outage (no engine request left): its end waits.
    deadline = time.monotonic() + 60
    while any(httpx.get(f"{replica.base_url}/health").json()["unfinished_requests"] for replica in fleet.replicas):
        assert time.monotonic() < deadline, "the background response's generation did not end"
        time.sleep(0.1)
    cluster.resume()
    # Back without a restart: the background response ended meanwhile, and its end was stored once it could be.
    deadline = time.monotonic() + 60
    while True:
        try:
            if not unfinished(client, background.id):
                break
        except openai.APIStatusError as exc:  # each process finds the store again on its next call
            assert exc.status_code == 503
        assert time.monotonic() < deadline, "the background response's end was never stored"
        time.sleep(0.2)
    ended = client.responses.retrieve(background.id)
    assert ended.status in ("completed", "incomplete") and ended.output_text, ended
    # Its stream replayed whole from the store (from a replica: vLLM's router drops a GET's query string).
    replayed = httpx.get(f"{fleet.replicas[1].base_url}/v1/responses/{background.id}", params={"stream": "true"},
                         timeout=30)
    events = [json.loads(payload) for payload in sse_payloads(replayed.text)]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[-1]["type"] == f"response.{ended.status}" and events[-1]["response"]["id"] == ended.id
    assert "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta") \
        == ended.output_text
    # Nothing stored before is lost, and stored state is made again on both replicas.
    assert client.responses.retrieve(kept.id).output_text == kept.output_text
    assert len(client.conversations.items.list(conversation.id).data) == 1
    turns = [kept]
    for _ in range(2):
        turns.append(client.responses.create(model=MODEL, input="more", previous_response_id=turns[-1].id,
                                             max_output_tokens=2))
    assert [client.responses.retrieve(turn.id).id for turn in turns] == [turn.id for turn in turns]


def test_a_replica_whose_engine_dies_mid_stream_is_left_out_then_rejoins(fleet: Fleet):
    dying, living = fleet.replicas
    streams = Streams(fleet.router.base_url, {"model": MODEL, "prompt": "long story", "max_tokens": 1500,
                                              "ignore_eos": True}, 2)
    dying.wait_for_unfinished(1)
    living.wait_for_unfinished(1)  # round robin: one stream on each
    time.sleep(0.5)  # past prefill: both are decoding
    [engine_core] = [p for p in dying.descendants() if p.name().startswith("VLLM::EngineCor")
                     or "EngineCore" in " ".join(p.cmdline())]
    engine_core.kill()
    endings = []
    for response in streams.join(120):
        assert response.status_code == 200
        events, done = sse_json(response.text)
        assert done == 1
        endings.append("error" if "error" in events[-1] else events[-1]["choices"][0]["finish_reason"])
    assert sorted(endings) == ["error", "length"], endings

    # What comes next goes to the live replica: its 503s are retried there, then it is left out.
    client = fleet.client()
    for _ in range(6):
        chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat.choices[0].finish_reason in ("length", "stop")

    # Restarted where the router knows it, it rejoins: requests reach it again.
    port = int(dying.base_url.rsplit(":", 1)[1])
    dying.stop()
    fleet.replicas[0] = back = start_server(fleet.directory / "replica0-again.log", fleet.environment(0), port=port)
    deadline = time.monotonic() + 60
    while '"event": "request"' not in back.log() or '"/v1/chat/completions"' not in back.log():
        assert time.monotonic() < deadline, "the restarted replica never got a request"
        chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat.choices[0].finish_reason in ("length", "stop")
        time.sleep(0.2)
