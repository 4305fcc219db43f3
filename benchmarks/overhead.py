"""Choir's own cost per request, without the engine: the real server over a scripted engine.

The engine-backed benchmark (`benchmarks.frontends`) shares two cores between the load, the server
and the engine core, so its figures swing by tens of percent. Here the engine is the tests'
scripted one (tests/fakes.py: the seam's outputs, one per token, no model), so the server's
CPU per request is Choir + Litestar + uvicorn alone, steady enough to compare two versions of a
change. Not a contest: vLLM's server cannot run over this engine.

    python -m benchmarks.overhead [--requests 3000] [--concurrency 16] [--tokens 16]
"""

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
from contextlib import asynccontextmanager

from benchmarks.frontends import RESULTS, Server, _cpu_seconds
from benchmarks.load import Scenario, run_scenario
from tests.integration.server import ROOT, free_port, wait_until_healthy


def create_null_app():
    """The app over a scripted engine that answers every request with `CHOIR_NULL_TOKENS` one-character tokens."""
    from choir.app.asgi import create_app
    from choir.core.settings import Settings
    from tests.fakes import FakeEngine, fake_engine_factory

    tokens = int(os.environ.get("CHOIR_NULL_TOKENS", "16"))
    engine = FakeEngine(script=lambda prompt, params: ["a"] * tokens, served_model_names=("choir-tiny",),
                        max_model_len=4096, max_images=4)
    fake = fake_engine_factory(engine)

    @asynccontextmanager
    async def factory(settings, model=None):  # the engine factory of a role (choir/plugins/engine/config.py)
        async with fake(settings) as started:
            gc.collect()
            gc.freeze()  # as the real engine's start-up does (choir/engine/vllm/engine.py)
            yield started

    return create_app(Settings(served_model_name="choir-tiny", log_level="warning"), engine_factory=factory)


def start_null(tokens: int) -> Server:
    """Choir over the scripted engine, under uvicorn in its own process (as `litestar run` serves it)."""
    port = free_port()
    env = {**os.environ, "CHOIR_NULL_TOKENS": str(tokens)}
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "benchmarks.overhead:create_null_app",
                                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                                "--no-access-log"], cwd=ROOT, env=env)
    server = Server("null", process, f"http://127.0.0.1:{port}", process.pid)
    wait_until_healthy(process, server.base_url)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    null = start_null(args.tokens)
    server, base_url = null.process, null.base_url
    results = {}
    try:
        for endpoint in ("completions", "chat"):
            for n in (1, 4):
                for stream in (True, False):
                    scenario = Scenario(endpoint, n, stream, args.tokens, args.concurrency, args.requests)
                    asyncio.run(run_scenario(base_url, Scenario(endpoint, n, stream, args.tokens, 4, 64)))  # warm
                    before = _cpu_seconds(server.pid)
                    result = asyncio.run(run_scenario(base_url, scenario))
                    cpu_ms = (_cpu_seconds(server.pid) - before) * 1000 / args.requests
                    results[scenario.label] = {**result, "server_cpu_ms_per_request": cpu_ms}
                    print(f"{scenario.label:<36} {cpu_ms:6.3f} ms CPU/request  {result['requests_per_s']:7.1f} req/s"
                          f"  {result['errors']} errors", flush=True)
    finally:
        server.terminate()
        server.wait(30)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "overhead.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))



if __name__ == "__main__":
    main()
