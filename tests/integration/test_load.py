"""Load and disconnects on the real engine, bounded in count and time, loopback only."""

import asyncio
import json
import random
import time

import httpx
import pytest

pytestmark = pytest.mark.engine
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Tell me something."}]


async def _unfinished(client: httpx.AsyncClient) -> int:
    return (await client.get("/health")).json()["unfinished_requests"]


async def _drained(client: httpx.AsyncClient, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while (left := await _unfinished(client)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return left


def test_256_concurrent_streaming_chats_with_n4(server):
    async def one(client: httpx.AsyncClient, seed: int) -> dict:
        finishes: dict[int, int] = {}
        done = errors = 0
        async with client.stream("POST", CHAT, json={"messages": MESSAGES, "n": 4, "seed": seed, "max_tokens": 8,
                                                     "ignore_eos": True, "stream": True}) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done += 1
                    continue
                chunk = json.loads(line[6:])
                errors += "error" in chunk
                for choice in chunk.get("choices", []):
                    if choice["finish_reason"]:
                        finishes[choice["index"]] = finishes.get(choice["index"], 0) + 1
        return {"done": done, "errors": errors, "finishes": finishes}

    async def main() -> None:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300, limits=limits) as client:
            results = await asyncio.gather(*(one(client, seed) for seed in range(256)))
            assert all(r["done"] == 1 and r["errors"] == 0 for r in results)
            assert all(r["finishes"] == {0: 1, 1: 1, 2: 1, 3: 1} for r in results)
            assert await _drained(client, 5) == 0

    asyncio.run(main())


def test_disconnect_storm_leaks_no_engine_request(server):
    rng = random.Random(7)

    async def leave_early(client: httpx.AsyncClient, index: int) -> None:
        stop_after = rng.randint(1, 40)
        body = {"messages": MESSAGES, "n": rng.choice([1, 2, 4]), "max_tokens": 400, "ignore_eos": True,
                "stream": True}
        async with client.stream("POST", CHAT, json=body) as response:
            seen = 0
            async for line in response.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= stop_after:
                    break  # leaving the block closes the connection mid-stream

    async def main() -> None:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
            await asyncio.gather(*(leave_early(client, i) for i in range(64)))
            assert await _drained(client, 10) == 0
            ok = await client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 4})
            assert ok.status_code == 200  # still serving

    asyncio.run(main())
