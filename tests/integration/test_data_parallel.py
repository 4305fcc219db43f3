"""Data parallel on the real CPU engine: two engine ranks, the children of `n > 1` requests placed on purpose
(CHOIR_FANOUT_PLACEMENT), and a second "node" on loopback (a headless engine, Choir as the head): the
commands docs/deploying.md ("Outgrowing one machine") shows."""

import os
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.integration.server import ROOT, Server, Streams, free_port, start_server
from tests.sse import sse_json

pytestmark = pytest.mark.engine


def children_per_engine(server: Server) -> dict[str, float]:
    """vLLM's finished engine requests, per engine rank (`vllm:request_success_total{engine=...}`)."""
    counts: dict[str, float] = {}
    for line in httpx.get(f"{server.base_url}/metrics").text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            engine = line.split('engine="', 1)[1].split('"', 1)[0]
            counts[engine] = counts.get(engine, 0) + float(line.rsplit(" ", 1)[1])
    return counts


def test_pinned_children_share_one_rank_under_two_api_processes(tmp_path):
    server = start_server(tmp_path / "server.log", {
        "CHOIR_API_SERVERS": "2",
        "CHOIR_ENGINE_ARGS": "--data-parallel-size 2"}, serve=True)
    try:
        for _ in range(6):
            before = children_per_engine(server)
            reply = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                               json={"prompt": "hi", "max_tokens": 4, "n": 4, "seed": 3})
            assert reply.status_code == 200 and len(reply.json()["choices"]) == 4
            after = children_per_engine(server)
            went = sorted(after[engine] - before.get(engine, 0) for engine in after)
            assert went == [0, 4], went  # every child of the request on one rank
        assert set(children_per_engine(server)) == {"0", "1"}
        assert all(count > 0 for count in children_per_engine(server).values())  # ranks taken in turn
    finally:
        server.stop()


def _headless_node(tmp_path, rpc_port: int) -> subprocess.Popen:
    """The second node: engine rank 1 only, handshaking with the head at 127.0.0.1:rpc_port."""
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_OMP_THREADS_BIND": "1",
           "CHOIR_ENGINE_ARGS": f"--headless --data-parallel-size 2 --data-parallel-size-local 1 "
                                f"--data-parallel-start-rank 1 --data-parallel-address 127.0.0.1 "
                                f"--data-parallel-rpc-port {rpc_port}"}
    log = (tmp_path / "headless.log").open("w")
    return subprocess.Popen([sys.executable, "-m", "choir.cli.serve"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def _head_and_node(tmp_path) -> tuple[Server, subprocess.Popen]:
    """The head (Choir) and its headless node. A head retried on another port (its engine took the one it was
    given) needs a fresh node too: the first one handshook with the head that exited."""
    for attempt in range(3):
        rpc_port = free_port()
        node = _headless_node(tmp_path, rpc_port)
        try:
            head = start_server(tmp_path / "head.log", {
                "VLLM_CPU_OMP_THREADS_BIND": "0", "CHOIR_FANOUT_PLACEMENT": "spread",
                "CHOIR_ENGINE_ARGS": f"--data-parallel-size 2 --data-parallel-size-local 1 "
                                     f"--data-parallel-address 127.0.0.1 --data-parallel-rpc-port {rpc_port}"},
                                attempts=1, serve=True)
            return head, node
        except RuntimeError as exc:
            _stop(node)
            if "address already in use" not in str(exc) or attempt == 2:
                raise RuntimeError(f"{exc}\nthe headless node's log:\n"
                                   f"{(tmp_path / 'headless.log').read_text(errors='replace')[-4000:]}") from None
    raise AssertionError("unreachable")


def _stop(node: subprocess.Popen) -> None:
    if node.poll() is None:
        node.terminate()
        try:
            node.wait(60)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()


def test_a_remote_headless_engine_serves_then_dies_cleanly(tmp_path):
    head, node = _head_and_node(tmp_path)
    try:
        for _ in range(4):
            reply = httpx.post(f"{head.base_url}/v1/completions", timeout=60,
                               json={"prompt": "hi", "max_tokens": 4, "n": 4})
            assert reply.status_code == 200 and len(reply.json()["choices"]) == 4
        counts = children_per_engine(head)
        assert sum(counts.values()) == 16 and counts.get("1", 0) > 0, counts  # rank 1 is the remote one

        streams = Streams(head.base_url, {"prompt": "long story", "n": 4, "max_tokens": 1500, "ignore_eos": True}, 2)
        head.wait_for_unfinished(8)
        time.sleep(1)  # decoding on both ranks
        [remote] = [p for p in psutil.Process(node.pid).children(recursive=True)
                    if p.name().startswith("VLLM::EngineCor")]
        remote.kill()
        for response in streams.join():  # nothing hangs
            if response.status_code == 200:
                events, done = sse_json(response.text)
                assert done == 1 and events[-1]["error"]["code"] == 503
            else:
                assert response.status_code == 503
        deadline = time.monotonic() + 10
        while httpx.get(f"{head.base_url}/health").status_code != 503:
            assert time.monotonic() < deadline, "health did not turn 503"
            time.sleep(0.1)
        assert node.wait(60) is not None  # the headless node stops once its engine is gone
    finally:
        head.stop()
        _stop(node)
