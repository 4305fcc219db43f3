"""Live latency with and without a large batch running: `python -m benchmarks.batch`.

One Choir server (the bundled model) under each scheduling policy (`--scheduling-policy fcfs` and `priority`). A
closed loop of live chat requests (concurrency 4, 16 tokens) is timed alone, then again while a batch of
`--lines` chat requests (64 tokens each) runs, CHOIR_BATCH_CONCURRENCY at a time. Reported per policy: live
latency and TTFT p50/p99 alone and beside the batch, and the batch's own pace (lines answered per second, from its
start to its cancel)."""

import argparse
import asyncio
import json
import time
from pathlib import Path

import aiohttp
import httpx

from benchmarks.load import percentile
from tests.integration.server import ROOT, Server, start_server

MODEL = "choir-tiny"


async def live(base_url: str, requests: int, concurrency: int = 4) -> dict:
    latencies, ttfts = [], []
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 16,
            "ignore_eos": True, "stream": True}

    async def lane(session: aiohttp.ClientSession, count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            first = None
            async with session.post(f"{base_url}/v1/chat/completions", json=body) as response:
                async for _chunk in response.content:
                    first = first or time.perf_counter()
            latencies.append((time.perf_counter() - started) * 1000)
            ttfts.append(((first or time.perf_counter()) - started) * 1000)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(lane(session, requests // concurrency) for _ in range(concurrency)))
    return {"latency_p50_ms": percentile(latencies, 0.5), "latency_p99_ms": percentile(latencies, 0.99),
            "ttft_p50_ms": percentile(ttfts, 0.5), "ttft_p99_ms": percentile(ttfts, 0.99)}


def start_batch(server: Server, lines: int) -> str:
    content = "\n".join(json.dumps({
        "custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Story {i}"}], "max_tokens": 64,
                 "ignore_eos": True}}) for i in range(lines)).encode()
    uploaded = httpx.post(f"{server.base_url}/v1/files", files={"file": ("batch.jsonl", content)},
                          data={"purpose": "batch"}, timeout=60).json()
    batch = httpx.post(f"{server.base_url}/v1/batches", json={"input_file_id": uploaded["id"],
                       "endpoint": "/v1/chat/completions", "completion_window": "24h"}, timeout=60).json()
    deadline = time.monotonic() + 60
    while httpx.get(f"{server.base_url}/v1/batches/{batch['id']}").json()["status"] != "in_progress":
        assert time.monotonic() < deadline, "the batch did not start"
        time.sleep(0.2)
    return batch["id"]


def answered(server: Server, batch_id: str) -> int:
    return httpx.get(f"{server.base_url}/v1/batches/{batch_id}").json()["request_counts"]["completed"]


def run(policy: str, requests: int, lines: int, directory: Path) -> dict:
    server = start_server(directory / f"choir-{policy}.log", {
        "CHOIR_ENGINE_ARGS": f"--scheduling-policy {policy}", "CHOIR_LOG_LEVEL": "warning",
        "CHOIR_STORE_URL": f"sqlite+aiosqlite:///{directory / f'store-{policy}.sqlite3'}"})
    try:
        asyncio.run(live(server.base_url, 8))  # warm up
        alone = asyncio.run(live(server.base_url, requests))
        batch_id = start_batch(server, lines)
        started = time.monotonic()
        beside = asyncio.run(live(server.base_url, requests))
        seconds = time.monotonic() - started
        httpx.post(f"{server.base_url}/v1/batches/{batch_id}/cancel", timeout=30)
        deadline = time.monotonic() + 60
        while httpx.get(f"{server.base_url}/v1/batches/{batch_id}").json()["status"] != "cancelled":
            assert time.monotonic() < deadline, "the batch was not cancelled"
            time.sleep(0.2)
        return {"policy": policy, "alone": alone, "beside_batch": beside,
                "batch_lines_per_second": answered(server, batch_id) / (time.monotonic() - started),
                "live_seconds": seconds}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", default=["fcfs", "priority"])
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--lines", type=int, default=2000)
    args = parser.parse_args()
    directory = ROOT / "benchmarks" / "results" / "batch"
    directory.mkdir(parents=True, exist_ok=True)
    rows = [run(policy, args.requests, args.lines, directory) for policy in args.policies]
    (directory / "batch.json").write_text(json.dumps(rows, indent=1))
    print("| scheduling | live alone: latency p50 / p99 ms | beside the batch | TTFT p50 / p99 ms alone | beside "
          "the batch | batch lines/s |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        a, b = row["alone"], row["beside_batch"]
        print(f"| {row['policy']} | {a['latency_p50_ms']:.0f} / {a['latency_p99_ms']:.0f} | "
              f"{b['latency_p50_ms']:.0f} / {b['latency_p99_ms']:.0f} | {a['ttft_p50_ms']:.0f} / "
              f"{a['ttft_p99_ms']:.0f} | {b['ttft_p50_ms']:.0f} / {b['ttft_p99_ms']:.0f} | "
              f"{row['batch_lines_per_second']:.1f} |")


if __name__ == "__main__":
    main()
