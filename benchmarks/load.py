"""A closed-loop async load generator for OpenAI-compatible servers (aiohttp, keep-alive connections).

aiohttp, not httpx: on two shared cores httpx spent ~1 ms of CPU per request, taken from the servers
it measured, and at 64 connections it stalled on loopback TCP (p50 ≈ 200 ms, p99 > 1.5 s, spurious
retransmissions) against every server alike, even one with no engine; aiohttp uses a quarter of
the CPU and does not stall. The connections are opened before the clock starts.
"""

import asyncio
import json
import statistics
import time
from dataclasses import dataclass

import aiohttp

PROMPT = "Once upon a time, in a land far away, there lived"
MESSAGES = [{"role": "user", "content": PROMPT}]


@dataclass(frozen=True)
class Scenario:
    endpoint: str  # completions | chat
    n: int
    stream: bool
    max_tokens: int
    concurrency: int
    requests: int

    @property
    def label(self) -> str:
        mode = "stream" if self.stream else "whole"
        return f"{self.endpoint} n={self.n} {mode} {self.max_tokens}tok c={self.concurrency}"

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    def body(self, seed: int) -> dict:
        body = {"model": "choir-tiny", "max_tokens": self.max_tokens, "n": self.n, "seed": seed, "ignore_eos": True,
                "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.endpoint == "chat":
            return {**body, "messages": MESSAGES}
        return {**body, "prompt": PROMPT}


class LoadError(Exception):
    pass


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _one(session: aiohttp.ClientSession, scenario: Scenario, seed: int) -> tuple[float, float | None, int]:
    started = time.perf_counter()
    async with session.post(scenario.path, json=scenario.body(seed)) as response:
        if response.status != 200:
            raise LoadError(f"HTTP {response.status}: {(await response.text())[:200]}")
        if not scenario.stream:
            return time.perf_counter() - started, None, (await response.json())["usage"]["completion_tokens"]
        first, tokens, done = None, 0, 0
        async for raw in response.content:  # one SSE line at a time
            if not raw.startswith(b"data: "):
                continue
            data = raw[6:].strip()
            if data == b"[DONE]":
                done += 1
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise LoadError(chunk["error"]["message"])
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - started
            if chunk.get("usage") and not chunk.get("choices"):
                tokens = chunk["usage"]["completion_tokens"]
    if done != 1:
        raise LoadError(f"{done} [DONE] events")
    return time.perf_counter() - started, first, tokens


async def run_scenario(base_url: str, scenario: Scenario) -> dict:
    latencies, ttfts, tokens, errors = [], [], 0, 0
    counter = iter(range(scenario.requests))
    connector = aiohttp.TCPConnector(limit=scenario.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(base_url=base_url, connector=connector, timeout=timeout) as session:

        async def connect() -> None:
            async with session.get("/v1/models") as response:
                await response.read()

        await asyncio.gather(*(connect() for _ in range(scenario.concurrency)))  # every connection open

        async def worker() -> None:
            nonlocal tokens, errors
            for seed in counter:
                try:
                    latency, ttft, produced = await _one(session, scenario, seed)
                except (aiohttp.ClientError, LoadError, KeyError, ValueError):
                    errors += 1
                    continue
                latencies.append(latency)
                tokens += produced
                if ttft is not None:
                    ttfts.append(ttft)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(scenario.concurrency)))
        elapsed = time.perf_counter() - started
    return summary(scenario, elapsed, latencies, ttfts, tokens, errors)


def summary(scenario: Scenario, elapsed: float, latencies: list[float], ttfts: list[float], tokens: int,
            errors: int) -> dict:
    result = {"requests_per_s": len(latencies) / elapsed, "output_tokens_per_s": tokens / elapsed,
              "latency_p50_ms": percentile(latencies, 0.5) * 1000, "latency_p99_ms": percentile(latencies, 0.99) * 1000,
              "errors": errors, "mean_output_tokens": tokens / max(1, len(latencies))}
    if ttfts:
        result["ttft_p50_ms"] = statistics.median(ttfts) * 1000
        result["ttft_p99_ms"] = percentile(ttfts, 0.99) * 1000
    return result
