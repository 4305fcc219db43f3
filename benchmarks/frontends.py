"""Front ends side by side: Choir, vLLM's Python OpenAI server, optionally vLLM's Rust front end, and
the engine called directly.

Same model directory, same engine flags (Choir's, for the bundled model), one contestant at a time
(two CPU engines on two cores disturb each other), rounds alternated A B A B; with `--paired`, every server
up at once and each scenario run on each in turn (the `engine` contestant is then left out). A closed-loop async
load generator keeps `concurrency` requests in flight and records requests/s, output tokens/s,
latency and time-to-first-token percentiles, errors, the front-end process's CPU milliseconds per
request (user+sys of the process that owns the listening socket, from /proc; the engine core is a
child process and is not counted) and its peak RSS. Prints one table with the ratios to vLLM's
server and the issue's targets, and writes JSON (every round, and the medians).

    python -m benchmarks.frontends [--rounds 2] [--requests 300] [--concurrency 1 16 64] [--tokens 16 128]
    python -m benchmarks.frontends --quick          # concurrency 16, 16 tokens
    python -m benchmarks.frontends --quick --paired --rounds 4 --contestants choir vllm
    python -m benchmarks.api_servers 1 2            # Choir and vLLM with N API processes (api_servers.py)
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

from benchmarks.load import Scenario, run_scenario
from choir.core.settings import Settings
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
    pid: int = 0  # the process that owns the listening socket (and so does the front end's work)


def engine_flags() -> list[str]:
    """The engine flags Choir gives the bundled model on this machine, in `vllm serve` syntax."""
    from vllm.platforms import current_platform

    from choir.engine.vllm.args import engine_argv

    return engine_argv(Settings(), on_cpu=current_platform.is_cpu())


def start(name: str, log: Path, attempts: int = 3) -> Server:
    """The contestant on a free port; retried on another if the engine's processes took it meanwhile."""
    for attempt in range(attempts):
        try:
            return _start(name, log)
        except RuntimeError:
            if "address already in use" not in log.read_text(errors="replace") or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _start(name: str, log: Path) -> Server:
    port = free_port()
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
        "VLLM_CPU_KVCACHE_SPACE", "1"), "CHOIR_LOG_LEVEL": "warning"}
    cwd = ROOT
    if name == "choir" or name.startswith("choir@"):
        cwd = Path(name.partition("@")[2] or ROOT)
        app = "choir.app.asgi:create_app" if (cwd / "choir" / "app").is_dir() else "app.asgi:create_app"  # before #34
        command = [sys.executable, "-m", "litestar", "--app", app, "run", "--host", "127.0.0.1", "--port", str(port)]
        env["PYTHONPATH"] = str(cwd)  # that checkout's code, not the one installed
    elif name == "vllm":  # vLLM's own Python server, with the very flags Choir gives the engine
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *engine_flags(), "--host",
                   "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    elif name == "rust":
        from benchmarks.rust_frontend import command as rust_command

        command, env = rust_command(engine_flags(), port, env)
    else:
        raise ValueError(f"unknown contestant {name}")
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = Server(name, process, f"http://127.0.0.1:{port}", process.pid)
    try:
        wait_until_healthy(process, server.base_url)
    except RuntimeError as exc:
        process.kill()
        raise RuntimeError(f"{name}: {exc}; see {log}") from None
    server.pid = _listener_pid(process.pid, port)
    return server


def _listener_pid(root: int, port: int) -> int:
    """The process (the root or one of its children) that listens on `port`."""
    import psutil

    for proc in [psutil.Process(root), *psutil.Process(root).children(recursive=True)]:
        try:
            if any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in proc.net_connections()):
                return proc.pid
        except psutil.Error:
            continue
    return root


def stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(60)
    except subprocess.TimeoutExpired:
        server.process.kill()


def scenarios(concurrencies: list[int], token_counts: list[int], requests: int,
              endpoints: tuple[str, ...] = ("completions", "chat"), ns: tuple[int, ...] = (1, 4),
              modes: tuple[str, ...] = ("stream", "whole")) -> list[Scenario]:
    out = []
    for concurrency in concurrencies:
        count = max(24, requests // 6) if concurrency == 1 else max(requests, 2 * concurrency)
        for tokens in token_counts:
            for endpoint in endpoints:
                for n in ns:
                    for stream in (mode == "stream" for mode in modes):
                        out.append(Scenario(endpoint, n, stream, tokens, concurrency, count))
    return out


async def run_watching_rss(pid: int, base_url: str, scenario: Scenario) -> tuple[dict, float]:
    """`run_scenario`, and the peak RSS of process `pid` while it ran (sampled every 50 ms)."""
    peak = _rss_mib(pid)

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, _rss_mib(pid))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        return await run_scenario(base_url, scenario), peak
    finally:
        watcher.cancel()


async def measure_http(server: Server, scenario: Scenario) -> dict:
    await run_scenario(server.base_url, Scenario(scenario.endpoint, scenario.n, scenario.stream, 4, 4, 8))  # warm
    cpu_before = _cpu_seconds(server.pid)
    result, peak = await run_watching_rss(server.pid, server.base_url, scenario)
    cpu = _cpu_seconds(server.pid) - cpu_before
    result["frontend_cpu_ms_per_request"] = cpu * 1000 / scenario.requests
    result["server_rss_peak_mib"] = peak
    return result


def summarize(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(run[k] for run in runs) for k in keys}


def log_of(name: str) -> Path:
    """Where a contestant's server writes its output (`choir@/tmp/old` → choir@_tmp_old.log)."""
    return RESULTS / f"{name.replace('/', '_')}.log"


def run_contestant(name: str, plan: list[Scenario]) -> dict[str, dict]:
    if name == "engine":
        from benchmarks.engine_direct import measure_all

        return asyncio.run(measure_all(plan))
    server = start(name, log_of(name))
    try:
        return {s.label: asyncio.run(measure_http(server, s)) for s in plan if _serves(name, s)}
    finally:
        stop(server)


def run_paired(names: list[str], plan: list[Scenario], rounds: int) -> dict[str, dict[str, list[dict]]]:
    """Every server started at once (all idle but the one measured), then each scenario run on each in turn,
    round after round, the order turned each round: a scenario's measurements on two servers are seconds apart,
    not the minutes of a whole pass, so the machine's drift (on shared cores, the same server's CPU per request
    varies 1.5× from one pass to the next) lands on both alike."""
    servers: list[Server] = []
    runs: dict[str, dict[str, list[dict]]] = {}
    try:
        for name in names:  # inside the try: a server that fails to start stops those already up
            servers.append(start(name, log_of(name)))
        for round_index in range(rounds):
            print(f"round {round_index + 1}", flush=True)
            turn = round_index % len(servers)
            order = servers[turn:] + servers[:turn]
            for scenario in plan:
                for server in order:
                    if _serves(server.name, scenario):
                        result = asyncio.run(measure_http(server, scenario))
                        runs.setdefault(scenario.label, {}).setdefault(server.name, []).append(result)
    finally:
        for server in servers:
            stop(server)
    return runs


def _serves(name: str, scenario: Scenario) -> bool:
    return not (name == "rust" and scenario.n > 1)  # vLLM's Rust front end: "Only n=1 is supported."


def arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The scenarios' and contestants' options (benchmarks/api_servers.py takes them too)."""
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=300, help="per scenario (concurrency 1: a sixth)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--quick", action="store_true", help="concurrency 16 and 16 tokens only")
    parser.add_argument("--contestants", nargs="+", default=["choir", "vllm", "engine"],
                        help="choir, vllm, engine, rust (needs benchmarks/rust_frontend.py's set-up), choir@DIR (Choir "
                             "from another checkout, an older commit's worktree: `git worktree add DIR COMMIT`)")
    parser.add_argument("--endpoints", nargs="+", choices=["completions", "chat"], default=["completions", "chat"])
    parser.add_argument("--n", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--modes", nargs="+", choices=["stream", "whole"], default=["stream", "whole"])
    parser.add_argument("--paired", action="store_true",
                        help="the servers up at once, each scenario on each in turn (see run_paired)")
    return parser


def plan_of(args: argparse.Namespace) -> list[Scenario]:
    if args.quick:
        args.concurrency, args.tokens = [16], [16]
    RESULTS.mkdir(parents=True, exist_ok=True)
    return scenarios(args.concurrency, args.tokens, args.requests, tuple(args.endpoints), tuple(args.n),
                     tuple(args.modes))


def main() -> None:
    args = arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0])).parse_args()
    plan = plan_of(args)
    if args.paired:
        runs = run_paired([name for name in args.contestants if name != "engine"], plan, args.rounds)
    else:
        runs = {}
        for round_index in range(args.rounds):
            for name in args.contestants:
                print(f"round {round_index + 1}: {name}", flush=True)
                for label, result in run_contestant(name, plan).items():
                    runs.setdefault(label, {}).setdefault(name, []).append(result)
    table = {label: {name: summarize(r) for name, r in by_name.items()} for label, by_name in runs.items()}
    print_table(table)
    targets = check_targets(table)
    print_targets(targets)
    out = RESULTS / "frontends.json"
    out.write_text(json.dumps({"args": vars(args), "scenarios": [asdict(s) for s in plan], "medians": table,
                               "targets": targets, "rounds": runs}, indent=2))
    print(f"wrote {out}")


def print_table(table: dict) -> None:
    print(f"{'scenario':<36} {'contestant':<8} {'req/s':>7} {'tok/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'ttft50':>7} {'ttft99':>7} {'cpu ms/req':>10} {'rss MiB':>8} {'err':>4} {'req/s÷vllm':>10} "
          f"{'cpu÷vllm':>8}")
    for label, by_name in table.items():
        base = by_name.get("vllm")
        for name, r in by_name.items():
            ratio = f"{r['requests_per_s'] / base['requests_per_s']:.2f}" if base else "-"
            cpu = r.get("frontend_cpu_ms_per_request")
            cpu_ratio = f"{cpu / base['frontend_cpu_ms_per_request']:.2f}" if base and cpu is not None else "-"
            print(f"{label:<36} {name:<8} {r['requests_per_s']:>7.1f} {r['output_tokens_per_s']:>7.0f} "
                  f"{r['latency_p50_ms']:>7.1f} {r['latency_p99_ms']:>7.1f} {r.get('ttft_p50_ms', 0):>7.1f} "
                  f"{r.get('ttft_p99_ms', 0):>7.1f} {cpu if cpu is not None else 0:>10.2f} "
                  f"{r.get('server_rss_peak_mib', 0):>8.0f} {r['errors']:>4.0f} {ratio:>10} {cpu_ratio:>8}")


def check_targets(table: dict) -> dict:
    """The issue's targets, each as the ratios it covers (Choir ÷ vLLM's server, scenario by scenario)."""
    cpu, rps, fanout, ttft, rss = {}, {}, {}, {}, {}
    for label, by_name in table.items():
        choir, vllm = by_name.get("choir"), by_name.get("vllm")
        if not (choir and vllm):
            continue
        cpu[label] = choir["frontend_cpu_ms_per_request"] / vllm["frontend_cpu_ms_per_request"]
        rps[label] = choir["requests_per_s"] / vllm["requests_per_s"]
        if " n=4 " in label:
            fanout[label] = rps[label]
        if label.endswith("c=1") and "ttft_p50_ms" in choir:
            ttft[label] = choir["ttft_p50_ms"] / vllm["ttft_p50_ms"]
        if label.endswith("c=64") and " stream " in label:
            rss[label] = {"choir": choir["server_rss_peak_mib"], "vllm": vllm["server_rss_peak_mib"]}
    return {
        "cpu_per_request_vs_vllm <= 0.5": _verdict(cpu, lambda r: r <= 0.5),
        "requests_per_s_vs_vllm >= 1.3": _verdict(rps, lambda r: r >= 1.3),
        "fanout_n4_requests_per_s_vs_vllm_native >= 1.0": _verdict(fanout, lambda r: r >= 1.0),
        "ttft_p50_at_c1_vs_vllm <= 1.0": _verdict(ttft, lambda r: r <= 1.0),
        "rss_mib_under_64_streams": rss,
    }


def _verdict(ratios: dict[str, float], ok) -> dict:
    if not ratios:
        return {}
    values = sorted(ratios.values())
    return {"met": sum(ok(v) for v in values), "of": len(values), "min": values[0],
            "median": statistics.median(values), "max": values[-1], "ratios": ratios}


def print_targets(targets: dict) -> None:
    print("\ntargets (Choir ÷ vLLM's Python server):")
    for name, verdict in targets.items():
        if name.startswith("rss"):
            for label, mib in verdict.items():
                print(f"  {label}: peak RSS Choir {mib['choir']:.0f} MiB, vLLM {mib['vllm']:.0f} MiB")
        elif verdict:
            print(f"  {name:<48} met in {verdict['met']}/{verdict['of']} scenarios; "
                  f"min {verdict['min']:.2f} median {verdict['median']:.2f} max {verdict['max']:.2f}")


if __name__ == "__main__":
    main()
