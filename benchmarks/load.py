"""A closed-loop async load generator for OpenAI-compatible servers (httpx, keep-alive connections)."""

import asyncio
import json
import statistics
import time
from dataclasses import dataclass

import httpx

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

    def body(self, seed: int) -> dict:
        body = {"model": "choir-tiny", "max_tokens": self.max_tokens, "n": self.n, "seed": seed, "ignore_eos": True,
                "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.endpoint == "chat":
            return {**body, "messages": MESSAGES}
        return {**body, "prompt": PROMPT}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _one(client: httpx.AsyncClient, url: str, scenario: Scenario, seed: int) -> tuple[float, float | None, int]:
    started = time.perf_counter()
    if not scenario.stream:
        response = await client.post(url, json=scenario.body(seed))
        response.raise_for_status()
        return time.perf_counter() - started, None, response.json()["usage"]["completion_tokens"]
    first, tokens, done = None, 0, 0
    async with client.stream("POST", url, json=scenario.body(seed)) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done += 1
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - started
            if chunk.get("usage") and not chunk.get("choices"):
                tokens = chunk["usage"]["completion_tokens"]
    if done != 1:
        raise RuntimeError(f"{done} [DONE] events")
    return time.perf_counter() - started, first, tokens


async def run_scenario(base_url: str, scenario: Scenario) -> dict:
    path = "/v1/chat/completions" if scenario.endpoint == "chat" else "/v1/completions"
    latencies, ttfts, tokens, errors = [], [], 0, 0
    counter = iter(range(scenario.requests))
    limits = httpx.Limits(max_connections=scenario.concurrency, max_keepalive_connections=scenario.concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:

        async def worker() -> None:
            nonlocal tokens, errors
            for seed in counter:
                try:
                    latency, ttft, produced = await _one(client, path, scenario, seed)
                except (httpx.HTTPError, RuntimeError, KeyError):
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
