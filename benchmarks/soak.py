"""A soak (issue #21): Choir under a mixed load for a long time; RSS over time, engine requests left, 5xx.

    python -m benchmarks.soak [--minutes 30] [--concurrency 64] [--sample-seconds 10] [--seed 0]

Closed-loop clients (aiohttp) draw each request, for the first model /v1/models lists, from a mix: ~85 %
good (chat n = 1 and 4, completions, streamed and not, a forced tool call, a json_schema response format),
~10 % that leave mid-request (a stream after its first few events, a whole answer after a short random
delay), ~5 % bad (malformed JSON, wrong types, unknown model, n or max_tokens out of range...). The RSS of
the server's process tree is sampled every few seconds; after the clients stop, the engine's running +
waiting requests (/metrics) must drain to 0. Passes (exit 0) when the server answered no 5xx (its own
counter: leavers included), nothing hung past HANG_SECONDS, every good request got a 200 without an error
event and every bad one a 4xx in OpenAI's error shape. Writes benchmarks/results/soak.json.

aiohttp, not httpx: httpcore 1.0.9's pool keeps the slot of a request cancelled at the wrong moment
(encode/httpcore#1093), and the cancelled requests of clients that leave wedged every connection of a
30-minute run's pool within minutes.
"""

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Coroutine

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.load import percentile

HANG_SECONDS = 120  # far past any answer of at most 64 tokens at concurrency 64 on two cores
DRAIN_SECONDS = 15
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
PROMPTS = ["Once upon a time, in a land far away, there lived", "Tell me about the sea.", "List three colours:"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
    "additionalProperties": False}}}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 16}, "score": {"type": "integer"}},
          "required": ["answer", "score"], "additionalProperties": False}
GOOD = ["chat n=1 stream", "chat n=1 whole", "chat n=4 stream", "chat n=4 whole", "completions n=1 stream",
        "completions n=1 whole", "completions n=4 stream", "completions n=4 whole", "tools", "json_schema"]
JSON = {"content-type": "application/json"}
# (name, path, body: a dict sent as JSON or bytes sent as they are, headers)
BAD: list[tuple[str, str, dict | bytes, dict]] = [
    ("malformed json", CHAT, b'{"model": "choir-tiny", "messages": [{"role": "user", "content": "hi"', JSON),
    ("max_tokens a string", CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}, {}),
    ("messages a string", CHAT, {"messages": "hi", "max_tokens": 8}, {}),
    ("unknown model", CHAT, {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, {}),
    ("n too large", CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 100_000, "max_tokens": 8}, {}),
    ("negative max_tokens", COMPLETIONS, {"prompt": "hi", "max_tokens": -5}, {}),
    ("max_tokens past the context", COMPLETIONS, {"prompt": "hi", "max_tokens": 10**7}, {}),
    ("negative temperature", CHAT, {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, {}),
    ("no prompt", COMPLETIONS, {"max_tokens": 8}, {}),
    ("unknown role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 8}, {}),
    ("named tool not in tools", CHAT, {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                                       "tool_choice": {"type": "function", "function": {"name": "nope"}}}, {}),
    ("schema not a schema", CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                   "response_format": {"type": "json_schema", "json_schema": {
                                       "name": "x", "schema": {"type": 12}}}}, {}),
    ("text/plain body", CHAT, b'{"messages": [{"role": "user", "content": "hi"}]}', {"content-type": "text/plain"}),
]


def good_request(kind: str, model: str, rng: random.Random) -> tuple[str, dict]:
    body: dict = {"model": model, "max_tokens": rng.randint(8, 48), "seed": rng.randrange(1 << 30)}
    if kind in ("tools", "json_schema"):  # constrained: always bounded, a random model can loop in a grammar
        body |= {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "stream": rng.random() < 0.5}
        if kind == "tools":
            body |= {"tools": [WEATHER], "tool_choice": rng.choice(["required", {
                "type": "function", "function": {"name": "get_weather"}}])}
        else:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
        return CHAT, body
    endpoint, n, mode = kind.split()
    body |= {"n": int(n[2:]), "stream": mode == "stream", "ignore_eos": rng.random() < 0.5}
    if mode == "stream" and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        return CHAT, body | {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}
    return COMPLETIONS, body | {"prompt": rng.choice(PROMPTS)}


async def send_good(session: aiohttp.ClientSession, path: str, body: dict) -> str:
    async with session.post(path, json=body) as response:
        if response.status != 200:
            await response.read()
            return str(response.status)
        if not body["stream"]:
            return "200" if "choices" in await response.json() else "200 without choices"
        done = 0
        async for raw in response.content:  # one SSE line at a time
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done += 1
            elif line.startswith("data: ") and "error" in json.loads(line[6:]):
                return f"error event: {line[6:200]}"
        return "200" if done == 1 else f"{done} [DONE]"


async def send_leaving(session: aiohttp.ClientSession, path: str, body: dict, rng: random.Random) -> str:
    if not body["stream"]:
        try:  # the cancellation closes the connection: the client is gone
            async with asyncio.timeout(rng.uniform(0.05, 0.5)):
                async with session.post(path, json=body) as response:
                    await response.read()
        except TimeoutError:
            return "left"
        return str(response.status)
    leave_after = rng.randint(1, 8)
    async with session.post(path, json=body) as response:
        async for raw in response.content:
            leave_after -= raw.startswith(b"data: ")
            if leave_after == 0:
                response.close()  # the connection, mid-stream
                return "left"
        return str(response.status)


async def send_bad(session: aiohttp.ClientSession, path: str, body: dict | bytes, headers: dict, model: str) -> str:
    if isinstance(body, bytes):
        request = session.post(path, data=body, headers=headers)
    else:
        request = session.post(path, json={"model": model, **body}, headers=headers)
    async with request as response:
        try:
            error = (await response.json(content_type=None))["error"]
            shaped = isinstance(error["message"], str) and isinstance(error["type"], str) and "param" in error \
                and "code" in error
        except (ValueError, KeyError, TypeError):
            shaped = False
        return str(response.status) + ("" if shaped else " not in OpenAI's error shape")


def draw(session: aiohttp.ClientSession, model: str,
         rng: random.Random) -> tuple[str, dict | bytes, Coroutine[None, None, str]]:
    """One request from the mix: its kind, its body (to report a hang) and the coroutine that sends it, which
    returns the outcome: a status, "left", or what went wrong."""
    share = rng.random()
    if share < 0.05:
        name, path, bad, headers = rng.choice(BAD)
        return f"bad: {name}", bad, send_bad(session, path, bad, headers, model)
    if share < 0.15:
        path, body = good_request(rng.choice(GOOD[:8]), model, rng)
        body |= {"max_tokens": 256, "ignore_eos": True}  # still running when the client leaves
        return f"leave {'stream' if body['stream'] else 'whole'}", body, send_leaving(session, path, body, rng)
    kind = rng.choice(GOOD)
    path, body = good_request(kind, model, rng)
    return kind, body, send_good(session, path, body)


def rss_mib(root_pid: int, api_pid: int) -> dict[str, float]:
    """RSS of the server's process tree by kind: the API process, the engine core(s), any other."""
    out: dict[str, float] = defaultdict(float)
    root = psutil.Process(root_pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            name, rss = proc.name(), proc.memory_info().rss
        except psutil.Error:
            continue
        kind = "api" if proc.pid == api_pid else "engine" if name.startswith("VLLM::") else "other"
        out[kind] += rss / 2**20
    return dict(out)


async def metrics(session: aiohttp.ClientSession) -> tuple[Counter, int]:
    """Choir's answers by status (all routes), and the engine's running + waiting requests."""
    statuses: Counter = Counter()
    in_engine = 0
    async with session.get("/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "choir_requests_total":
                statuses[sample.labels["status"]] += int(sample.value)
            elif sample.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                in_engine += int(sample.value)
    return statuses, in_engine


async def soak(base_url: str, seconds: float, concurrency: int, root_pid: int, api_pid: int | None = None,
               sample_seconds: float = 10, seed: int = 0, log=print) -> dict:
    api_pid = api_pid or root_pid
    outcomes: dict[str, Counter] = defaultdict(Counter)
    latencies: dict[str, list[float]] = defaultdict(list)
    hangs: list[str] = []
    samples: list[dict] = []
    connector, timeout = aiohttp.TCPConnector(limit=concurrency + 4), aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(base_url, connector=connector, timeout=timeout) as session:
        async with session.get("/v1/models") as response:
            model = (await response.json())["data"][0]["id"]
        statuses_before, _ = await metrics(session)
        started = time.monotonic()
        deadline = started + seconds

        async def worker(index: int) -> None:
            rng = random.Random(seed * 10_000 + index)
            while time.monotonic() < deadline:
                began = time.monotonic()
                kind, body, send = draw(session, model, rng)
                try:
                    outcome = await asyncio.wait_for(send, HANG_SECONDS)
                except TimeoutError:
                    outcome = "hang"
                    hangs.append(f"{kind} hung past {HANG_SECONDS}s: {body!r}")
                except (aiohttp.ClientError, ValueError) as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                outcomes[kind][outcome] += 1
                latencies[kind].append(time.monotonic() - began)

        async def sampler() -> None:
            while True:
                samples.append({"t_s": round(time.monotonic() - started), **rss_mib(root_pid, api_pid)})
                log(f"{samples[-1]['t_s']:>5}s RSS " + "  ".join(
                    f"{k} {v:.1f}" for k, v in samples[-1].items() if k != "t_s") + f" MiB; "
                    f"{sum(map(len, latencies.values()))} requests")
                await asyncio.sleep(sample_seconds)

        watch = asyncio.create_task(sampler())
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.monotonic() - started
        watch.cancel()
        samples.append({"t_s": round(elapsed), **rss_mib(root_pid, api_pid)})
        drain_deadline = time.monotonic() + DRAIN_SECONDS
        while (left := (await metrics(session))[1]) and time.monotonic() < drain_deadline:
            await asyncio.sleep(0.5)
        statuses_after, _ = await metrics(session)
    server_statuses = {s: n - statuses_before.get(s, 0) for s, n in sorted(statuses_after.items())
                       if n > statuses_before.get(s, 0)}
    return {"seconds": elapsed, "concurrency": concurrency, "requests": sum(map(len, latencies.values())),
            "by_kind": {kind: {"count": len(latencies[kind]), "requests_per_s": len(latencies[kind]) / elapsed,
                               "latency_p50_ms": percentile(latencies[kind], 0.5) * 1000,
                               "latency_p99_ms": percentile(latencies[kind], 0.99) * 1000,
                               "outcomes": dict(outcomes[kind])} for kind in sorted(latencies)},
            "server_statuses": server_statuses,
            "server_5xx": sum(n for s, n in server_statuses.items() if s.startswith("5")),
            "engine_requests_left": left, "hangs": hangs, "rss_mib": samples,
            "rss_summary": {kind: {"start": samples[0].get(kind, 0), "peak": max(s.get(kind, 0) for s in samples),
                                   "end": samples[-1].get(kind, 0)} for kind in samples[0] if kind != "t_s"}}


def failures(result: dict) -> list[str]:
    out = [f"{result['server_5xx']} answers were 5xx"] if result["server_5xx"] else []
    if result["engine_requests_left"]:
        out.append(f"{result['engine_requests_left']} engine requests left running or waiting")
    out += result["hangs"]
    for kind, stats in result["by_kind"].items():
        for outcome, count in stats["outcomes"].items():
            if kind.startswith("bad"):
                expected = len(outcome) == 3 and outcome.startswith("4")  # anything after the status is a fault
            else:
                expected = outcome in ("left", "200") if kind.startswith("leave") else outcome == "200"
            if not expected and outcome != "hang":  # hangs are listed with their bodies
                out.append(f"{kind}: {count}× {outcome}")
    return out


def print_summary(result: dict) -> None:
    print(f"\n{result['requests']} requests in {result['seconds']:.0f}s at concurrency {result['concurrency']} "
          f"({result['requests'] / result['seconds']:.1f} req/s)")
    print(f"{'kind':<36} {'count':>7} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8}  outcomes")
    for kind, s in result["by_kind"].items():
        print(f"{kind:<36} {s['count']:>7} {s['requests_per_s']:>7.2f} {s['latency_p50_ms']:>8.0f} "
              f"{s['latency_p99_ms']:>8.0f}  {s['outcomes']}")
    print("RSS MiB (start / peak / end): " + "; ".join(
        f"{k} {v['start']:.1f} / {v['peak']:.1f} / {v['end']:.1f}" for k, v in result["rss_summary"].items()))
    print(f"server statuses {result['server_statuses']}; 5xx {result['server_5xx']}; engine requests left "
          f"{result['engine_requests_left']}; hangs {len(result['hangs'])}")


def main() -> None:
    from benchmarks.frontends import RESULTS, start, stop

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--sample-seconds", type=float, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    server = start("choir", RESULTS / "soak-choir.log")
    try:
        result = asyncio.run(soak(server.base_url, args.minutes * 60, args.concurrency, server.process.pid,
                                  server.pid, args.sample_seconds, args.seed, log=lambda s: print(s, flush=True)))
    finally:
        stop(server)
    result["failures"] = failures(result)
    print_summary(result)
    (RESULTS / "soak.json").write_text(json.dumps({"args": vars(args), **result}, indent=2))
    print(json.dumps({k: result[k] for k in ("server_statuses", "server_5xx", "engine_requests_left", "rss_summary",
                                             "failures")}, indent=2))
    sys.exit(1 if result["failures"] else 0)


if __name__ == "__main__":
    main()
