"""Two replicas behind vLLM's router, one policy after another: `python -m benchmarks.routers`.

Each replica (Choir, or `vllm serve` with `--replicas vllm`: same model, same engine flags) has one core and
publishes its engine's KV-cache events over ZMQ (block size 32, the CPU build's smallest); `kv_aware` is given
them as static sources, as vLLM's router documents. Two workloads, chat streamed, closed loop:

- `shared-prefix`: sixteen long system prompts (one per "tenant"), each with varied questions, eight at a time;
- `multi-turn`: eight conversations of four turns each, every turn sent with the whole conversation so far.

Per policy and workload: requests/s, TTFT p50/p99 (ms), the prefix-cache hit rate over both engines (Δ hits ÷
Δ queries of `vllm:prefix_cache_{hits,queries}_total`) and the share of prefill tokens the busier replica took.
The prefix caches are emptied (`/reset_prefix_cache`, development mode) before each run."""

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.load import percentile
from choir.core.settings import Settings
from tests.integration.routers import start_router
from tests.integration.server import ROOT, Server, free_port, start_server, start_vllm_server

MODEL = "choir-tiny"
BLOCK = 32
POLICIES = ("round_robin", "cache_aware", "kv_aware")
TENANTS = 16  # distinct long system prompts


def system_prompt(tenant: int) -> str:
    return f"You are assistant {tenant}. " + " ".join(f"Fact {i} about topic {tenant}." for i in range(60))


def start_replicas(kind: str, directory: Path) -> tuple[list[Server], list[int]]:
    ports, replicas = [free_port(), free_port()], []
    for index, port in enumerate(ports):
        events = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}",
                             "topic": "kv"})
        engine = ["--kv-events-config", events, "--block-size", str(BLOCK), "--prefix-caching-hash-algo", "sha256_cbor"]
        os.environ.update({"VLLM_CPU_OMP_THREADS_BIND": str(index), "PYTHONHASHSEED": "0",
                           "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0", "VLLM_SERVER_DEV_MODE": "1"})
        if kind == "choir":
            replicas.append(start_server(directory / f"choir{index}.log", {
                "CHOIR_ENGINE_ARGS": " ".join(f"'{arg}'" for arg in engine), "CHOIR_LOG_LEVEL": "warning"}))
        else:
            from vllm.platforms import current_platform

            from choir.engine.vllm.args import engine_argv

            settings = Settings(model=str(ROOT / "models" / MODEL), served_model_name=MODEL, engine_args=tuple(engine))
            replicas.append(start_vllm_server(directory / f"vllm{index}.log",
                                              engine_argv(settings, on_cpu=current_platform.is_cpu())))
    return replicas, ports


def counters(replica: Server) -> dict[str, float]:
    text = httpx.get(f"{replica.base_url}/metrics", timeout=10).text
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name in ("vllm:prefix_cache_hits_total",
                                                            "vllm:prefix_cache_queries_total")}


def conversations(workload: str, requests: int, seed: int = 0) -> list[list[list[dict]]]:
    """Lanes of requests (each a message list): a lane's requests go one after another, lanes at once."""
    chooser = random.Random(seed)
    if workload == "shared-prefix":
        lanes: list[list[list[dict]]] = [[] for _ in range(8)]
        for index in range(requests):
            tenant = chooser.randrange(TENANTS)
            lanes[index % 8].append([{"role": "system", "content": system_prompt(tenant)},
                                     {"role": "user", "content": f"Question {chooser.randrange(10**6)}?"}])
        return lanes
    lanes = []
    for lane in range(8):
        history = [{"role": "system", "content": system_prompt(lane) + f" Session {lane}."}]
        turns = []
        for turn in range(max(1, requests // 8)):
            history = [*history, {"role": "user", "content": f"Turn {turn}: tell me more."}]
            turns.append(history)
            history = [*history, {"role": "assistant", "content": f"Here is more, part {turn}."}]
        lanes.append(turns)
    return lanes


async def drive(base_url: str, lanes: list[list[list[dict]]]) -> dict:
    ttfts: list[float] = []
    errors = 0

    async def lane(session: aiohttp.ClientSession, messages_list: list[list[dict]]) -> None:
        nonlocal errors
        for messages in messages_list:
            started = time.perf_counter()
            body = {"model": MODEL, "messages": messages, "max_tokens": 8, "stream": True}
            async with session.post(f"{base_url}/v1/chat/completions", json=body) as response:
                if response.status != 200:
                    errors += 1
                    await response.read()
                    continue
                first = None
                async for _ in response.content:
                    first = first or time.perf_counter()
                ttfts.append(((first or time.perf_counter()) - started) * 1000)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(lane(session, messages) for messages in lanes))
        elapsed = time.perf_counter() - started
    return {"requests": len(ttfts), "errors": errors, "req_s": len(ttfts) / elapsed,
            "ttft_p50_ms": percentile(ttfts, 0.5), "ttft_p99_ms": percentile(ttfts, 0.99)}


def run(kind: str, policies: list[str], workloads: list[str], requests: int, directory: Path) -> list[dict]:
    replicas, ports = start_replicas(kind, directory)
    rows = []
    try:
        for policy in policies:
            flags = []
            if policy == "kv_aware":
                os.environ["VLLM_ROUTER_TOKENIZER"] = str(ROOT / "models" / MODEL)
                for replica, port in zip(replicas, ports, strict=True):
                    flags += ["--kv-event-source", f"{replica.base_url}=tcp://127.0.0.1:{port}"]
                flags += ["--kv-event-block-size", str(BLOCK), "--kv-event-model", MODEL]
            router = start_router("vllm-router", policy, [r.base_url for r in replicas],
                                  directory / f"router-{policy}.log", flags)
            try:
                for workload in workloads:
                    for replica in replicas:
                        httpx.post(f"{replica.base_url}/reset_prefix_cache", timeout=30).raise_for_status()
                    before = [counters(replica) for replica in replicas]
                    result = asyncio.run(drive(router.base_url, conversations(workload, requests)))
                    after = [counters(replica) for replica in replicas]
                    queries = [a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
                               for a, b in zip(after, before, strict=True)]
                    hits = sum(a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
                               for a, b in zip(after, before, strict=True))
                    rows.append({"replicas": kind, "policy": policy, "workload": workload, **result,
                                 "hit_rate": hits / sum(queries) if sum(queries) else 0.0,
                                 "busier_share": max(queries) / sum(queries) if sum(queries) else 0.0})
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                router.stop()
    finally:
        for replica in replicas:
            replica.stop()
    return rows


def print_table(rows: list[dict]) -> None:
    print("| replicas | policy | workload | req/s | TTFT p50 ms | TTFT p99 ms | prefix-cache hits | busier replica's "
          "share | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['replicas']} | {row['policy']} | {row['workload']} | {row['req_s']:.2f} | "
              f"{row['ttft_p50_ms']:.0f} | {row['ttft_p99_ms']:.0f} | {row['hit_rate']:.1%} | "
              f"{row['busier_share']:.0%} | {row['errors']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", nargs="+", default=["choir"], choices=["choir", "vllm"])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument("--workloads", nargs="+", default=["shared-prefix", "multi-turn"])
    parser.add_argument("--requests", type=int, default=160)
    args = parser.parse_args()
    directory = ROOT / "benchmarks" / "results" / "routers"
    directory.mkdir(parents=True, exist_ok=True)
    rows = [row for kind in args.replicas for row in run(kind, args.policies, args.workloads, args.requests,
                                                          directory)]
    (directory / "routers.json").write_text(json.dumps(rows, indent=1))
    print_table(rows)


if __name__ == "__main__":
    main()
