"""Where the children of an `n > 1` request run under data parallelism: CHOIR_FANOUT_PLACEMENT=spread (vLLM's
balancer places each child) against pinned (all children of one request on one rank, the ranks in turn).

Choir (`python -m choir.cli.serve`) with CHOIR_ENGINE_ARGS="--data-parallel-size 2" (two engine cores, each bound to
a CPU core of its own) serves n = 4 completions (not streamed) in two workloads:

- long-prompt: ~1500 prompt tokens of the bundled model (max-model-len 2048), 8 output tokens: prefill-bound.
- long-answer: a short prompt, 256 output tokens: decode-bound.

Every request's prompt starts with its own tag, so no prefix is shared between requests, only between a
request's children. A closed-loop load (benchmarks/load.py) keeps `concurrency` requests in flight for a fixed
number of requests and records req/s and latency; /metrics before and after gives where the children went
(`vllm:request_success_total` per engine label) and each engine's prefix-cache hits; /proc the CPU ms per
request of the front end (the processes benchmarks/api_servers.py counts as such) and of the engine side
(engine cores, their workers, the DP coordinator). Placements alternate (spread, pinned, spread, pinned);
medians over rounds are printed and written to benchmarks/results/placement.json.

    python -m benchmarks.placement [--rounds 2] [--concurrency 4 16] [--requests 160]
    python -m benchmarks.placement --workloads long-prompt --concurrency 16
"""

import argparse
import asyncio
import functools
import json
import statistics
from dataclasses import asdict, dataclass

import httpx

from benchmarks.api_servers import frontend_processes
from benchmarks.frontends import _cpu_seconds
from benchmarks.load import PROMPT, Scenario, run_scenario
from choir.core.settings import BUNDLED_MODEL_DIR
from tests.integration.server import ROOT, Server, start_server

RESULTS = ROOT / "benchmarks" / "results"
WORKLOADS = {"long-prompt": (1500, 8), "long-answer": (0, 256)}  # prompt tokens (0: short), max_tokens
FILLER = "Once upon a time, in a land far away, there lived a king who had three daughters and a dog. "
COUNTERS = ("vllm:request_success_total", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


@dataclass(frozen=True)
class Workload(Scenario):
    name: str = ""
    prompt_tokens: int = 0
    tag: str = ""  # makes this run's prompts its own

    @property
    def label(self) -> str:
        return f"{self.name} c={self.concurrency}"

    def body(self, seed: int) -> dict:
        return {**super().body(seed), "prompt": prompt(f"[{self.tag}-{seed}] ", self.prompt_tokens)}


def prompt(head: str, tokens: int) -> str:
    return head + (_filler(tokens) if tokens else PROMPT)


@functools.cache
def _filler(tokens: int) -> str:
    """Filler text of `tokens` tokens of the bundled model's tokenizer (with the head, a few more)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(BUNDLED_MODEL_DIR / "tokenizer.json"))
    text = FILLER * (tokens // 10 + 1)
    encoding = tokenizer.encode(text, add_special_tokens=False)
    return text[:encoding.offsets[tokens - 12][1]]  # room for the head's tokens and BOS


def counters(base_url: str) -> dict[str, dict[str, float]]:
    """COUNTERS by engine label, from /metrics."""
    out: dict[str, dict[str, float]] = {name: {} for name in COUNTERS}
    for line in httpx.get(f"{base_url}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0]
        if name in out and 'engine="' in line:
            engine = line.split('engine="', 1)[1].split('"', 1)[0]
            out[name][engine] = out[name].get(engine, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def measure(server: Server, workload: Workload) -> dict:
    warm = Workload("completions", workload.n, False, workload.max_tokens, 4, 8, workload.name, workload.prompt_tokens,
                    f"warm-{workload.tag}")
    await run_scenario(server.base_url, warm)
    front = frontend_processes(server.process.pid)
    tree = [proc.pid for proc in server.descendants()] + [server.process.pid]
    cpu_before = {pid: _cpu_seconds(pid) for pid in tree}
    before = counters(server.base_url)
    result = await run_scenario(server.base_url, workload)
    after = counters(server.base_url)
    cpu = {pid: _cpu_seconds(pid) - cpu_before[pid] for pid in tree}
    result["frontend_cpu_ms_per_request"] = sum(cpu[pid] for pid in tree if pid in front) * 1000 / workload.requests
    result["engine_cpu_ms_per_request"] = sum(cpu[pid] for pid in tree if pid not in front) * 1000 / workload.requests
    delta = {name: {engine: after[name][engine] - before[name].get(engine, 0.0) for engine in sorted(after[name])}
             for name in COUNTERS}
    result["children_per_engine"] = delta["vllm:request_success_total"]
    hits, queries = delta["vllm:prefix_cache_hits_total"], delta["vllm:prefix_cache_queries_total"]
    result["prefix_cache_hit_rate"] = sum(hits.values()) / max(1.0, sum(queries.values()))
    result["prompt_tokens"] = _prompt_tokens(server.base_url, workload)
    return result


def _prompt_tokens(base_url: str, workload: Workload) -> int:
    body = {**workload.body(0), "max_tokens": 1, "n": 1, "prompt": prompt("[probe-0] ", workload.prompt_tokens)}
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=60).json()["usage"]["prompt_tokens"]


def run_placement(placement: str, round_index: int, args: argparse.Namespace) -> dict[str, dict]:
    env = {"CHOIR_ENGINE_ARGS": "--data-parallel-size 2", "CHOIR_FANOUT_PLACEMENT": placement,
           "CHOIR_API_SERVERS": str(args.api_servers), "CHOIR_LOG_LEVEL": "warning", "VLLM_CPU_KVCACHE_SPACE": "1"}
    server = start_server(RESULTS / f"placement-{placement}.log", env, serve=True)
    try:
        out = {}
        for name in args.workloads:
            prompt_tokens, max_tokens = WORKLOADS[name]
            for concurrency in args.concurrency:
                workload = Workload("completions", args.n, False, max_tokens, concurrency,
                                    max(args.requests, 2 * concurrency), name, prompt_tokens,
                                    f"{placement}{round_index}c{concurrency}")
                out[workload.label] = asyncio.run(measure(server, workload))
                print(f"  {workload.label}: {out[workload.label]['requests_per_s']:.1f} req/s", flush=True)
        return out
    finally:
        server.stop()


def summarize(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    out: dict = {k: statistics.median(run[k] for run in runs) for k in keys}
    engines = sorted({engine for run in runs for engine in run["children_per_engine"]})
    out["children_per_engine"] = {e: statistics.mean(run["children_per_engine"].get(e, 0.0) for run in runs)
                                  for e in engines}
    return out


def print_table(table: dict) -> None:
    print(f"{'workload':<18} {'placement':<9} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'prompt tok':>10} "
          f"{'prefix hits':>11} {'fe cpu ms':>9} {'eng cpu ms':>10} {'children per engine':<22} {'err':>4} "
          f"{'req/s ÷ spread':>14} {'p50 ÷ spread':>12}")
    for label, by_placement in table.items():
        spread = by_placement.get("spread")
        for placement, r in by_placement.items():
            rps = f"{r['requests_per_s'] / spread['requests_per_s']:.2f}" if spread else "-"
            p50 = f"{r['latency_p50_ms'] / spread['latency_p50_ms']:.2f}" if spread else "-"
            children = ", ".join(f"{e}: {c:.0f}" for e, c in r["children_per_engine"].items())
            print(f"{label:<18} {placement:<9} {r['requests_per_s']:>7.2f} {r['latency_p50_ms']:>8.1f} "
                  f"{r['latency_p99_ms']:>8.1f} {r['prompt_tokens']:>10.0f} {r['prefix_cache_hit_rate']:>10.0%} "
                  f"{r.get('frontend_cpu_ms_per_request', 0):>9.1f} {r.get('engine_cpu_ms_per_request', 0):>10.1f} "
                  f"{children:<22} {r['errors']:>4.0f} {rps:>14} {p50:>12}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="each round: every placement, in --placements' order")
    parser.add_argument("--placements", nargs="+", choices=["spread", "pinned"], default=["spread", "pinned"])
    parser.add_argument("--requests", type=int, default=160, help="per workload and concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--api-servers", type=int, default=1, help="CHOIR_API_SERVERS")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, list[dict]]] = {}
    for round_index in range(args.rounds):
        for placement in args.placements:
            print(f"round {round_index + 1}: {placement}", flush=True)
            for label, result in run_placement(placement, round_index, args).items():
                runs.setdefault(label, {}).setdefault(placement, []).append(result)
    table = {label: {p: summarize(r) for p, r in by_placement.items()} for label, by_placement in runs.items()}
    print_table(table)
    out = RESULTS / "placement.json"
    out.write_text(json.dumps({"args": vars(args), "workloads": {k: asdict(Workload("completions", args.n, False,
                               v[1], 0, 0, k, v[0])) for k, v in WORKLOADS.items()}, "medians": table,
                               "rounds": runs}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
