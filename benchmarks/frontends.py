"""Front ends side by side: Choir, vLLM's Python OpenAI server, and the engine called directly.

Same model directory, same engine flags (Choir's, for the bundled model), one contestant at a time
(two CPU engines on two cores disturb each other), rounds alternated A B A B. A closed-loop async
load generator keeps `concurrency` requests in flight and records requests/s, output tokens/s,
latency and time-to-first-token percentiles, errors, and the front-end process's CPU milliseconds
per request (user+sys of the server process, from /proc; the engine core is a child process and is
not counted). Prints one table with ratios to vLLM's server and writes JSON.

    python -m benchmarks.frontends [--rounds 2] [--requests 200] [--concurrency 16] [--quick]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from app.settings import Settings
from benchmarks.load import Scenario, run_scenario
from tests.integration.server import ROOT, free_port, wait_until_healthy

RESULTS = ROOT / "benchmarks" / "results"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Server:
    name: str
    process: subprocess.Popen
    base_url: str


def start(name: str, log: Path) -> Server:
    port = free_port()
    settings = Settings()
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
        "VLLM_CPU_KVCACHE_SPACE", "1"), "CHOIR_LOG_LEVEL": "warning"}
    if name == "choir":
        command = [sys.executable, "-m", "litestar", "--app", "app.asgi:create_app", "run", "--host", "127.0.0.1",
                   "--port", str(port)]
    else:  # vLLM's own Python server, with the very flags Choir gives the engine
        from vllm.platforms import current_platform

        from plugins.engine.vllm_engine import CPU_ENGINE_ARGS

        flags = settings.engine_argv(CPU_ENGINE_ARGS if current_platform.is_cpu() else ())
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *flags, "--host", "127.0.0.1",
                   "--port", str(port), "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = Server(name, process, f"http://127.0.0.1:{port}")
    try:
        wait_until_healthy(process, server.base_url)
    except RuntimeError as exc:
        process.kill()
        raise RuntimeError(f"{name}: {exc}; see {log}") from None
    return server


def stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(60)
    except subprocess.TimeoutExpired:
        server.process.kill()


def scenarios(quick: bool, requests: int, concurrency: int) -> list[Scenario]:
    out = []
    for endpoint in ("completions", "chat"):
        for n in (1, 4):
            for stream in (True, False):
                for tokens in ((16,) if quick else (16, 128)):
                    out.append(Scenario(endpoint, n, stream, tokens, concurrency, requests))
    return out


async def measure_http(server: Server, scenario: Scenario) -> dict:
    await run_scenario(server.base_url, Scenario(scenario.endpoint, scenario.n, scenario.stream, 4, 4, 8))  # warm
    cpu_before = _cpu_seconds(server.process.pid)
    result = await run_scenario(server.base_url, scenario)
    result["frontend_cpu_ms_per_request"] = (_cpu_seconds(server.process.pid) - cpu_before) * 1000 / scenario.requests
    result["server_rss_mib"] = _rss_mib(server.process.pid)
    return result


def summarize(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(run[k] for run in runs) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="16 output tokens only")
    parser.add_argument("--contestants", nargs="+", default=["choir", "vllm", "engine"])
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    plan = scenarios(args.quick, args.requests, args.concurrency)
    runs: dict[str, dict[str, list[dict]]] = {}
    for round_index in range(args.rounds):
        for name in args.contestants:
            print(f"round {round_index + 1}: {name}", flush=True)
            if name == "engine":
                from benchmarks.engine_direct import measure_all

                results = asyncio.run(measure_all(plan))
            else:
                server = start(name, RESULTS / f"{name}.log")
                try:
                    results = {s.label: asyncio.run(measure_http(server, s)) for s in plan}
                finally:
                    stop(server)
            for label, result in results.items():
                runs.setdefault(label, {}).setdefault(name, []).append(result)
    table = {label: {name: summarize(r) for name, r in by_name.items()} for label, by_name in runs.items()}
    _print(table)
    out = RESULTS / "frontends.json"
    out.write_text(json.dumps({"args": vars(args), "scenarios": [asdict(s) for s in plan], "results": table},
                              indent=2))
    print(f"wrote {out}")


def _print(table: dict) -> None:
    header = (f"{'scenario':<34} {'contestant':<8} {'req/s':>7} {'tok/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'ttft50':>7} {'cpu ms/req':>10} {'err':>4} {'req/s÷vllm':>10} {'cpu÷vllm':>8}")
    print(header)
    for label, by_name in table.items():
        base = by_name.get("vllm")
        for name, r in by_name.items():
            ratio = f"{r['requests_per_s'] / base['requests_per_s']:.2f}" if base else "-"
            cpu = r.get("frontend_cpu_ms_per_request")
            cpu_ratio = f"{cpu / base['frontend_cpu_ms_per_request']:.2f}" if base and cpu is not None else "-"
            print(f"{label:<34} {name:<8} {r['requests_per_s']:>7.1f} {r['output_tokens_per_s']:>7.0f} "
                  f"{r['latency_p50_ms']:>7.1f} {r['latency_p99_ms']:>7.1f} {r.get('ttft_p50_ms', 0):>7.1f} "
                  f"{cpu if cpu is not None else 0:>10.2f} {r['errors']:>4.0f} {ratio:>10} {cpu_ratio:>8}")


if __name__ == "__main__":
    main()
