"""The routers the field runs in front of replicas, started for real from their PyPI wheels: vLLM's router
(`vllm-router`) and SGLang's gateway (`smg`), on a free loopback port."""

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.integration.server import free_port

BIN = Path(sys.executable).parent


@dataclass
class Router:
    program: str
    process: subprocess.Popen
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def router_command(program: str, policy: str, port: int, workers: list[str], flags: list[str]) -> list[str]:
    # SGLang's gateway keeps a Responses store of its own unless told not to: the replicas' shared store serves
    # stored responses and conversations, so it passes them through.
    own = [] if program == "vllm-router" else ["launch", "--backend", "vllm", "--history-backend", "none"]
    return [str(BIN / program), *own, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
            "--policy", policy, *flags]


def start_router(program: str, policy: str, workers: list[str], log_path: Path,
                 flags: Sequence[str] = (), env: dict[str, str] | None = None) -> Router:
    """The router, once it lists the workers' models."""
    port = free_port()
    with log_path.open("w") as log:  # the router writes to its own copy of the descriptor
        process = subprocess.Popen(router_command(program, policy, port, workers, list(flags)), stdout=log,
                                   stderr=subprocess.STDOUT, env={**os.environ, "NO_PROXY": "*", **(env or {})})
    router = Router(program, process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{router.base_url}/v1/models", timeout=2).status_code == 200:
                return router
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                router.stop()
            raise RuntimeError(f"{program} did not start:\n{router.log()[-3000:]}")
        time.sleep(0.3)
