"""Server memory: peak RSS under 64 concurrent streams, and RSS across a 10,000-request soak.

    python -m benchmarks.memory [--contestant choir] [--requests 10000] [--block 1000]

The soak cycles through streaming and whole, n = 1 and n = 4, completions and chat, at concurrency 16,
and reads the server's RSS after every block of requests. The first block warms caches and
allocators; growth is measured from its end to the last block's. Writes benchmarks/results/memory-<name>.json.
"""

import argparse
import asyncio
import itertools
import json

from benchmarks.frontends import RESULTS, _rss_mib, run_watching_rss, start, stop
from benchmarks.load import Scenario, run_scenario

MIX = [Scenario("chat", 1, True, 16, 16, 0), Scenario("completions", 4, False, 16, 16, 0),
       Scenario("completions", 1, True, 16, 16, 0), Scenario("chat", 4, True, 16, 16, 0)]


async def peak_under_streams(base_url: str, pid: int, streams: int) -> dict:
    scenario = Scenario("chat", 1, True, 128, streams, 4 * streams)
    result, peak = await run_watching_rss(pid, base_url, scenario)
    return {"scenario": scenario.label, "peak_rss_mib": peak, "errors": result["errors"]}


async def soak(base_url: str, pid: int, requests: int, block: int) -> dict:
    samples, errors, done = [], 0, 0
    mix = itertools.cycle(MIX)
    while done < requests:
        # Each block: its share of every scenario in the mix.
        for template in [next(mix) for _ in MIX]:
            count = block // len(MIX)
            result = await run_scenario(base_url, Scenario(template.endpoint, template.n, template.stream,
                                                           template.max_tokens, template.concurrency, count))
            errors += result["errors"]
            done += count
        samples.append({"requests": done, "rss_mib": _rss_mib(pid)})
        print(f"{done:>6} requests: RSS {samples[-1]['rss_mib']:.1f} MiB", flush=True)
    warm, last = samples[0], samples[-1]
    return {"samples": samples, "errors": errors, "growth_mib": last["rss_mib"] - warm["rss_mib"],
            "growth_mib_per_1000": (last["rss_mib"] - warm["rss_mib"]) * 1000 / max(1, last["requests"] -
                                                                                    warm["requests"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contestant", default="choir", choices=["choir", "vllm"])
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--block", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=64)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    server = start(args.contestant, RESULTS / f"{args.contestant}.log")
    try:
        result = {"idle_rss_mib": _rss_mib(server.pid)}
        result["under_streams"] = asyncio.run(peak_under_streams(server.base_url, server.pid, args.streams))
        print(f"idle RSS {result['idle_rss_mib']:.1f} MiB; peak under {args.streams} streams "
              f"{result['under_streams']['peak_rss_mib']:.1f} MiB", flush=True)
        result["soak"] = asyncio.run(soak(server.base_url, server.pid, args.requests, args.block))
    finally:
        stop(server)
    s = result["soak"]
    print(f"soak: {s['samples'][-1]['requests']} requests, {s['errors']} errors, RSS {s['samples'][0]['rss_mib']:.1f}"
          f" → {s['samples'][-1]['rss_mib']:.1f} MiB after the first block ({s['growth_mib']:+.1f} MiB, "
          f"{s['growth_mib_per_1000']:+.2f} MiB per 1000 requests)")
    (RESULTS / f"memory-{args.contestant}.json").write_text(json.dumps({"args": vars(args), **result}, indent=2))


if __name__ == "__main__":
    main()
