"""CHOIR_API_SERVERS=2 for real: `python -m choir.cli.serve` (what `make serve` runs) starts one engine core and two
API processes attached to it, as `vllm serve --api-server-count 2` does. What is per process must hold for
the whole server: metrics, health, the disconnect abort, SIGTERM, and a process that dies."""

import json
import signal
import time

import httpx
import psutil
import pytest

from choir.core.settings import BUNDLED_LORA_DIR, bundled_model_dir
from tests.databases import postgres_or_none
from tests.integration.server import Server, Streams, start_server
from tests.integration.test_fanout import engine_gauge
from tests.sse import sse_json

pytestmark = pytest.mark.engine

TWO = {"CHOIR_API_SERVERS": "2"}


def served_by_count(server: Server) -> dict[int, int]:
    """Request lines per API process (each worker's lines carry its index)."""
    lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    counts: dict[int, int] = {}
    for line in lines:
        if line.get("event") == "request" and "api_server" in line:
            counts[line["api_server"]] = counts.get(line["api_server"], 0) + 1
    return counts


def served_by(server: Server) -> set[int]:
    return set(served_by_count(server))


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Server:
    """Every engine role through the same path: the embedding engine's cores are started once too, and
    each worker attaches to both; the adapter of CHOIR_LORA_MODULES is loaded by each worker."""
    server = start_server(tmp_path_factory.mktemp("two") / "server.log", {
        **TWO, "CHOIR_EMBEDDING_MODEL": str(bundled_model_dir("embed")),
        "CHOIR_LORA_MODULES": f"tiny-lora={BUNDLED_LORA_DIR}", "CHOIR_ENGINE_ARGS": "--max-lora-rank 8"},
        serve=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def two_on_postgres(tmp_path_factory, request) -> Server:
    """Two API processes whose store is PostgreSQL (as processes on several hosts would share it)."""
    url = postgres_or_none(request)
    if url is None:
        pytest.skip("the PostgreSQL variant runs with CHOIR_TEST_POSTGRES=1 (`make test` sets it)")
    server = start_server(tmp_path_factory.mktemp("two-pg") / "server.log", {**TWO, "CHOIR_STORE_URL": url},
                          serve=True)
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def shared(request) -> Server:
    """Two API processes over one store: the default SQLite file (WAL: the processes of one host), then
    PostgreSQL."""
    return request.getfixturevalue("two" if request.param == "sqlite" else "two_on_postgres")


def test_a_response_stored_by_one_process_is_continued_by_the_other(shared):
    """Both API processes share one store: each continuation below is served by whichever process accepts
    it, and every one finds its parent whichever stored it."""
    two = shared
    def request_lines() -> list[dict]:
        return [json.loads(line) for line in two.log().splitlines()
                if line.startswith("{") and json.loads(line).get("event") == "request"]

    previous, seen = None, len(request_lines())
    servers: set[int] = set()
    # A new connection each, taken by whichever process accepts it first: at least 12, and on until both
    # processes have served some (the kernel may hand one process many in a row)
    for sent in range(1, 61):
        body = {"model": "choir-tiny", "input": "hi", "max_output_tokens": 2, "previous_response_id": previous}
        reply = httpx.post(f"{two.base_url}/v1/responses", json={k: v for k, v in body.items() if v}, timeout=60)
        assert reply.status_code == 200, reply.text
        previous = reply.json()["id"]
        if sent >= 12:
            servers = {line["api_server"] for line in request_lines()[seen:] if line["path"] == "/v1/responses"}
            if len(servers) == 2:
                break
    assert servers == {0, 1}  # both processes stored and continued
    final = httpx.get(f"{two.base_url}/v1/responses/{previous}", timeout=60).json()
    assert final["previous_response_id"] and final["store"] is True


def test_a_background_response_is_followed_and_cancelled_from_either_process(shared):
    """A background response is made by the process that took its request; its stream is read, and its cancel
    lands, on whichever process takes each later connection (the other one reads the stored events)."""
    two = shared
    def background(max_output_tokens: int) -> str:
        body = {"model": "choir-tiny", "input": "hi", "background": True, "max_output_tokens": max_output_tokens}
        reply = httpx.post(f"{two.base_url}/v1/responses", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["status"] == "queued", reply.text
        return reply.json()["id"]

    response_id, before = background(40), served_by_count(two)
    for round_ in range(24):  # a new connection each, until both processes have streamed it (4 at least)
        streamed = httpx.get(f"{two.base_url}/v1/responses/{response_id}", params={"stream": "true"}, timeout=60)
        events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        assert events[-1]["type"] in ("response.completed", "response.incomplete")
        after = served_by_count(two)
        if round_ >= 3 and all(after.get(i, 0) > before.get(i, 0) for i in (0, 1)):
            break
    assert all(after.get(i, 0) > before.get(i, 0) for i in (0, 1)), (before, after)
    for _ in range(4):  # cancels that may land on the other process: the run stops at its next batch
        long = background(1500)
        cancelled = httpx.post(f"{two.base_url}/v1/responses/{long}/cancel", timeout=60).json()
        assert cancelled["status"] == "cancelled"
        deadline = time.monotonic() + 30
        while httpx.get(f"{two.base_url}/v1/responses/{long}", timeout=60).json()["status"] != "cancelled":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    deadline = time.monotonic() + 30  # every cancelled generation was stopped in the engine
    while httpx.get(f"{two.base_url}/health", timeout=60).json()["unfinished_requests"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_conversation_is_continued_by_either_process(shared):
    two = shared
    conversation = httpx.post(f"{two.base_url}/v1/conversations", timeout=60,
                              json={"items": [{"role": "user", "content": "start"}]}).json()
    for index in range(8):  # a new connection each
        reply = httpx.post(f"{two.base_url}/v1/responses", timeout=60, json={
            "model": "choir-tiny", "input": f"turn {index}", "max_output_tokens": 2,
            "conversation": conversation["id"]})
        assert reply.status_code == 200, reply.text
    items = httpx.get(f"{two.base_url}/v1/conversations/{conversation['id']}/items",
                      params={"order": "asc", "limit": 100}, timeout=60).json()["data"]
    users = [item["content"][0]["text"] for item in items if item["role"] == "user"]
    assert users == ["start", *(f"turn {index}" for index in range(8))]
    assert [item["role"] for item in items].count("assistant") == 8  # each turn's answer, after its input


def test_both_processes_serve_one_engine(two):
    ids = set()
    for _ in range(24):  # a new connection each: the kernel hands each to whichever process accepts it
        reply = httpx.post(f"{two.base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=60)
        assert reply.status_code == 200
        ids.add(reply.json()["id"])
    assert len(ids) == 24  # response ids unique across processes
    assert served_by(two) == {0, 1}
    assert two.log().count('"role": "generate", "api_servers": 2') == 1  # one engine core, started once
    assert two.log().count('"role": "embed", "api_servers": 2') == 1


def test_every_process_serves_every_model(two):
    """The embedding engine and the adapter answer from whichever process takes the connection."""
    before = served_by_count(two)
    for round_ in range(48):  # the kernel picks the process per connection: until both have answered (12 at least)
        embedded = httpx.post(f"{two.base_url}/v1/embeddings", json={"input": "hi"}, timeout=60)
        assert embedded.status_code == 200 and len(embedded.json()["data"][0]["embedding"]) > 0
        tuned = httpx.post(f"{two.base_url}/v1/completions", timeout=60,
                           json={"model": "tiny-lora", "prompt": "hi", "max_tokens": 3})
        assert tuned.status_code == 200 and tuned.json()["model"] == "tiny-lora"
        after = served_by_count(two)
        if round_ >= 11 and all(after.get(i, 0) > before.get(i, 0) for i in (0, 1)):
            break
    assert all(after.get(i, 0) > before.get(i, 0) for i in (0, 1)), (before, after)
    listed = [card["id"] for card in httpx.get(f"{two.base_url}/v1/models").json()["data"]]
    assert listed == ["choir-tiny", "tiny-lora", "choir-tiny-embed"]


def test_metrics_show_the_whole_server(two):
    def total(text: str, sample: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample))

    sample = 'choir_requests_total{method="POST",route="createChat'
    before = total(httpx.get(f"{two.base_url}/metrics").text, sample)
    for _ in range(10):
        httpx.post(f"{two.base_url}/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    scrapes = [httpx.get(f"{two.base_url}/metrics").text for _ in range(6)]  # answered by either process
    assert {total(text, sample) - before for text in scrapes} == {10}
    for text in scrapes:  # vLLM's engine gauges once per engine (two here), not once per API process
        series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
        assert len(series) == len(set(series)), sorted({s for s in series if series.count(s) > 1})
        # What llm-d's endpoint picker and vLLM's production stack scrape: each family once, a series per engine.
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:cache_config_info", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            assert text.count(f"# TYPE {name} ") == 1, name
            assert 1 <= sum(line.startswith(f"{name}{{") for line in text.splitlines()) <= 2, name
        # One series per set of adapters seen running and waiting, its value when last seen (as vLLM's): llm-d
        # reads the newest.
        assert text.count("# TYPE vllm:lora_requests_info ") == 1
        lora = [line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{")]
        assert lora and all('max_lora="' in line and "running_lora_adapters=" in line
                            and "waiting_lora_adapters=" in line for line in lora), lora


def test_a_client_that_leaves_aborts_its_children(two):
    body = {"prompt": "story", "n": 4, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{two.base_url}/v1/completions", json=body) as response:
            lines = response.iter_lines()
            seen = 0
            while seen < 8:
                seen += next(lines).startswith("data: ")
            response.close()
    deadline = time.monotonic() + 10
    while engine_gauge(two, "vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "the engine still runs the children of a stream nobody reads"
        time.sleep(0.1)


def running(server: Server, count: int) -> None:
    """Until the engine decodes `count` requests (vLLM's gauge: the engine's, whichever process answers)."""
    deadline = time.monotonic() + 30
    while engine_gauge(server, "vllm:num_requests_running") < count:
        assert time.monotonic() < deadline, f"fewer than {count} requests running"
        time.sleep(0.05)


def test_sigterm_drains_every_process_then_stops_the_engine(tmp_path):
    server = start_server(tmp_path / "server.log", TWO, serve=True)
    streams = Streams(server.base_url, {"prompt": "long story", "max_tokens": 600, "ignore_eos": True}, 4)
    running(server, 4)
    code = server.stop()  # SIGTERM; asserts that no process is left behind
    results = streams.join()
    assert code == 0
    for response in results:  # drained: every stream ran to its end
        events, done = sse_json(response.text)
        assert done == 1 and events[-1]["choices"][0]["finish_reason"] == "length"


def test_an_engine_that_dies_makes_every_process_unhealthy(tmp_path):
    server = start_server(tmp_path / "server.log", TWO, serve=True)
    try:
        [core] = [p for p in server.descendants() if p.name().startswith("VLLM::EngineCor")]
        streams = Streams(server.base_url, {"prompt": "long story", "max_tokens": 1500, "ignore_eos": True}, 4)
        running(server, 4)
        core.kill()
        for response in streams.join():
            assert response.status_code == 200
            events, done = sse_json(response.text)
            assert done == 1 and events[-1]["error"]["code"] == 503
        # Every process says so: 503 on each of many fresh connections (either process answers each).
        deadline = time.monotonic() + 10
        while True:
            codes = [httpx.get(f"{server.base_url}/health").status_code for _ in range(12)]
            if set(codes) == {503}:
                break
            assert time.monotonic() < deadline, codes
            time.sleep(0.2)
        reply = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert reply.status_code == 503
        assert server.process.poll() is None  # up, for an orchestrator's health check to restart
    finally:
        server.stop()


def test_an_api_process_that_dies_stops_the_server_cleanly(tmp_path):
    server = start_server(tmp_path / "server.log", TWO, serve=True)
    everything = server.descendants()
    worker = next(p for p in everything if p.name().startswith("VLLM::APIServ"))
    worker.send_signal(signal.SIGKILL)
    try:
        code = server.process.wait(60)
    except Exception:
        server.stop()
        raise
    assert code == 1
    _, alive = psutil.wait_procs(everything, timeout=20)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"
    assert "an API process exited" in server.log()
