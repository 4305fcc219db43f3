"""Where a front end's CPU goes: py-spy samples the server process under one load scenario.

    python -m benchmarks.profile [--contestant choir] [--endpoint completions] [--n 1] [--stream] [--requests 2000]

Writes the raw (collapsed) stacks to benchmarks/results/profile-<label>.txt, a flame graph beside it, and
prints the functions with the most samples: on their own (self) and with what they call (total),
and the share per package. Needs `py-spy` (pip install py-spy); it samples with --gil, so only
time holding the GIL (the event loop's work) is counted, not idle waits.
"""

import argparse
import asyncio
import collections
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from benchmarks.frontends import RESULTS, _cpu_seconds, log_of, start, stop
from benchmarks.load import Scenario, run_scenario


def _frame_name(frame: str) -> str:
    # py-spy's raw frames: "function (path/to/module.py:line)"
    function, _, where = frame.partition(" (")
    return f"{function} ({where.rsplit(':', 1)[0]})" if where else function


def _package(frame: str) -> str:
    # py-spy names a file by its package path ("uvicorn/protocols/http/...", "choir/app/serving/...")
    path = frame.partition(" (")[2].rsplit(":", 1)[0]
    top = path.split("/")[0] if "/" in path else "stdlib"
    return "choir" if top in ("app", "plugins") else top


# Each sample goes to the stage of its innermost frame that one of these names (checked leaf to root, in order
# per frame): the request's path through the front end, issue #40's stages. A frame is py-spy's
# "function (path:line)"; a rule is (stage, substrings of the path, function names or None for any).
STAGES: list[tuple[str, tuple[str, ...], tuple[str, ...] | None]] = [
    ("scripted engine (null contestant only)", ("fakes.py",), None),
    ("metrics", ("prometheus_client/", "choir/plugins/metrics.py", "plugins/metrics.py"), None),
    ("request log", ("choir/app/request_log.py", "app/request_log.py", "structlog/"), None),
    ("auth", ("plugins/auth.py",), None),
    ("body read, decode and depth scan", ("app/requests.py",), None),
    ("validation and compat rules", ("core/compat.py", "core/protocol/", "app/routes/begin.py"), None),
    # vLLM's renderer and Choir's calls into it (the tokenizer's own frames, which the detokenizer shares, are
    # not a stage: a sample in them goes to whoever called them)
    ("render (chat template, tokenizer)", ("vllm/renderers/", "vllm/entrypoints/chat_utils", "engine/vllm/base.py",
                                           "plugins/media.py", "jinja2/"), None),
    ("vLLM's server (FastAPI, serving, pydantic)", ("vllm/entrypoints/", "fastapi/", "starlette/", "pydantic/",
                                                    "pydantic_core/"), None),
    ("engine output processing", ("vllm/v1/engine/output_processor.py", "vllm/v1/engine/detokenizer.py",
                                  "vllm/v1/engine/logprobs.py", "vllm/v1/metrics/", "vllm/outputs.py"), None),
    ("engine hand-off (input, ZMQ)", ("vllm/v1/engine/", "zmq/", "vllm/sampling_params.py",
                                      "engine/vllm/sampling.py", "engine/vllm/engine.py"), None),
    ("SSE framing", ("app/serving/streaming.py", "app/routes/event_stream.py", "app/routes/replies.py"), None),
    ("output assembly (aggregation, chunks)", ("plugins/aggregation.py", "app/serving/chat_output.py",
                                               "app/serving/completions.py", "app/serving/logprobs.py",
                                               "app/serving/tool_stream.py"), None),
    ("planning (sampling, fan-out)", ("app/serving/", "plugins/fanout.py", "plugins/pipeline.py",
                                      "app/routes/"), None),
    ("HTTP (uvicorn: parse, socket writes)", ("uvicorn/", "httptools/", "h11/"), None),
    ("Litestar (routing, DI, responses)", ("litestar/",), None),
    ("asyncio and the event loop", ("asyncio/", "selectors.py"), None),
]


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        function, _, where = frame.partition(" (")
        for stage, paths, functions in STAGES:
            if any(path in where for path in paths) and (functions is None or function in functions):
                return stage
    return "other"


def stages(raw: Path) -> collections.Counter[str]:
    counted: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if stack:
            counted[stage_of(stack.split(";"))] += int(count_text)
    return counted


def stage_table(raw: Path, cpu_ms: float | None) -> str:
    """Each stage's share of the GIL-holding samples and, with the server's CPU per request, its milliseconds."""
    counted = stages(raw)
    samples = sum(counted.values()) or 1
    lines = ["\nby stage:"]
    for stage, count in counted.most_common():
        share = count / samples
        ms = f"  {share * cpu_ms:6.3f} ms" if cpu_ms is not None else ""
        lines.append(f"{100 * share:6.1f}%{ms}  {stage}")
    return "\n".join(lines)


def summarize(raw: Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        samples += count
        own[_frame_name(frames[-1])] += count
        packages[_package(frames[-1])] += count
        for name in {_frame_name(frame) for frame in frames}:
            total[name] += count
    lines = [f"{samples} samples"]
    for title, counter in (("by package (self)", packages), ("self", own), ("total", total)):
        lines.append(f"\n{title}:")
        lines += [f"{100 * c / samples:6.1f}%  {name}" for name, c in counter.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contestant", default="choir",
                        help="choir, vllm, null (Choir over the scripted engine), choir@DIR (another checkout)")
    parser.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--native", action="store_true", help="C frames too (pauses the server to sample)")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    RESULTS.mkdir(parents=True, exist_ok=True)
    scenario = Scenario(args.endpoint, args.n, args.stream, args.tokens, args.concurrency, args.requests)
    label = f"{args.contestant.replace('/', '_')}-{args.endpoint}-n{args.n}-{'stream' if args.stream else 'whole'}"
    raw = RESULTS / f"profile-{label}.txt"
    raw.unlink(missing_ok=True)
    if args.contestant == "null":  # Choir over the scripted engine: the front end's own cost alone
        from benchmarks.overhead import start_null

        server = start_null(args.tokens)
    else:
        server = start(args.contestant, log_of(args.contestant))
    try:
        asyncio.run(run_scenario(server.base_url, Scenario(args.endpoint, args.n, args.stream, 4, 4, 32)))  # warm
        mode = ["--native"] if args.native else ["--nonblocking"]
        spy = subprocess.Popen([py_spy, "record", "--pid", str(server.pid), "--gil", *mode,
                                "--rate", "1000", "--format", "raw", "--output", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        began = _cpu_seconds(server.pid)
        result = asyncio.run(run_scenario(server.base_url, scenario))
        cpu_ms = 1000 * (_cpu_seconds(server.pid) - began) / max(1, args.requests)
        spy.send_signal(signal.SIGINT)
        if spy.wait(60) not in (0, -signal.SIGINT) or not raw.exists():
            raise SystemExit(f"py-spy failed (exit {spy.returncode})")
    finally:
        stop(server)
    print(f"{scenario.label}: {result['requests_per_s']:.1f} req/s, {result['errors']} errors")
    print(f"server CPU per request: {cpu_ms:.3f} ms (py-spy's own sampling included)")
    print(summarize(raw, args.top))
    print(stage_table(raw, cpu_ms))
    print(f"raw stacks: {raw}")


if __name__ == "__main__":
    main()
