"""`choir-serve` (`make serve`): Choir in one process, or in N API processes over one set of engine cores.

- CHOIR_API_SERVERS=1 (the default): uvicorn and the app in this process, which starts the engines in its
  lifespan: exactly `litestar run` / `uvicorn --factory app.asgi:create_app`.
- CHOIR_API_SERVERS=N > 1 (or `--api-server-count N` in CHOIR_ENGINE_ARGS): this process is a supervisor, as
  `vllm serve --api-server-count N` is. It binds the one listening socket, starts each engine role's cores
  (plugins/engine/vllm_cores.py), then N workers (app/worker.py) through vLLM's APIServerProcessManager,
  each attached to the cores as client i of N. /metrics merges every worker (prometheus_client's
  multiprocess mode). SIGTERM/SIGINT: every worker drains, then the engines stop. A worker that dies takes
  the server down (exit 1), engines included.
- `--headless` in CHOIR_ENGINE_ARGS: engine cores only, for a data-parallel head elsewhere (vLLM's
  `vllm serve --headless`, run by vLLM's own code).
"""

import argparse
import signal
import sys
import time
from contextlib import ExitStack
from multiprocessing import connection
from typing import Any

from core.settings import Settings, SettingsError

# SIGTERM reaches the workers, which drain for CHOIR_DRAIN_SECONDS; this much more for the rest of their exit.
EXIT_MARGIN_SECONDS = 15


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="choir-serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--root-path", default="", help="served below this path (behind a proxy), as uvicorn's")
    options = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        if settings.headless or settings.api_servers > 1:
            from plugins.engine.vllm_version import check_vllm_version

            check_vllm_version(settings.environ)  # before vLLM's launchers are imported
        if settings.headless:
            run_headless(settings)
        elif settings.api_servers == 1:
            import uvicorn

            uvicorn.run("app.asgi:create_app", factory=True, host=options.host, port=options.port,
                        root_path=options.root_path, log_config=None, access_log=False)
        else:
            sys.exit(supervise(settings, options.host, options.port, {"root_path": options.root_path}))
    except SettingsError as exc:
        print(f"choir: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


def supervise(settings: Settings, host: str, port: int, uvicorn_options: dict[str, Any]) -> int:
    """Returns the exit code: 0 after a signal, 1 when a worker died."""
    import structlog

    from app.request_log import configure_logging

    configure_logging(settings.log_level)
    log = structlog.get_logger("choir.serve")
    from vllm.entrypoints.launchers.launcher import create_server_socket
    from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus
    from vllm.v1.utils import APIServerProcessManager

    from app.worker import WorkerArgs, run_worker
    from plugins.engine.vllm_cores import EngineCores
    from plugins.engine.vllm_engine import (
        check_gpu_share,
        engine_environment,
        parse_embedding_engine_args,
        parse_engine_args,
    )

    _check_before_engines(settings)
    n = settings.api_servers
    setup_multiprocess_prometheus()  # before any worker imports prometheus_client
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            raise SystemExit

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    engine_environment(settings)
    from vllm.platforms import current_platform

    sock = create_server_socket((host, port), reuse_port=True)
    generation = parse_engine_args(settings, on_cpu=current_platform.is_cpu())
    embedding = parse_embedding_engine_args(settings) if settings.embedding_model is not None else None
    if embedding is not None and not current_platform.is_cpu():
        check_gpu_share(generation, embedding)
    roles = [EngineCores("generation", generation, n, "CHOIR_ENGINE_ARGS")]
    if embedding is not None:
        roles.append(EngineCores("embedding", embedding, n, "CHOIR_EMBEDDING_ENGINE_ARGS"))
    workers: Any = None
    code = 0
    try:
        with ExitStack() as starting:  # leaving it: every role's cores hand-shake (embedding first)
            clients = [starting.enter_context(role.launch()) for role in roles]
            workers = APIServerProcessManager(
                listen_address=f"http://{host}:{port}", sock=sock,
                args=WorkerArgs(settings, uvicorn_options, tuple(clients[1]) if len(clients) > 1 else ()),
                num_servers=n, input_listeners=roles[0].listeners.inputs,
                output_listeners=roles[0].listeners.outputs, target_server_fn=run_worker,
                stats_update_address=clients[0][0].get("stats_update_address"))
            for role in roles:
                role.watch(workers.processes)
            for role in roles[1:]:
                role.close_listeners()
        sock.close()  # every worker has its own copy
        log.info("serving", url=f"http://{host}:{port}", api_servers=n, pids=[p.pid for p in workers.processes])
        code = _wait(workers.processes, roles, log)
    except SystemExit:
        pass
    finally:
        timeout = settings.drain_seconds + EXIT_MARGIN_SECONDS
        started = time.monotonic()
        if workers is not None:
            workers.shutdown(timeout=timeout)
        for role in reversed(roles):
            role.shutdown(timeout=max(5.0, timeout - (time.monotonic() - started)))
        log.info("stopped", seconds=round(time.monotonic() - started, 1))
    return code


def _check_before_engines(settings: Settings) -> None:
    """What every worker would refuse at its start-up (the profile, the parsers' names), refused once here,
    in one line, before any engine starts."""
    from app.serving.parsers import parser_classes
    from plugins.spec import SpecConfig

    _ = SpecConfig(compat=settings.compat).operation_rules
    parser_classes(settings.reasoning_parser, settings.tool_parser)


def _wait(workers: list[Any], roles: list[Any], log: Any) -> int:
    """Until a worker exits (1: the server cannot serve as configured) or a signal comes (SystemExit).
    An engine core that dies is logged here; the workers see it (watch_engine_connections), answer 503
    and /health says so, as one Choir process does (an orchestrator restarts the server)."""
    waiting = {proc.sentinel: proc.name for proc in workers}
    for role in roles:
        waiting.update(role.sentinels())
    worker_sentinels = {proc.sentinel for proc in workers}
    while True:
        for sentinel in connection.wait(list(waiting)):
            name = waiting.pop(sentinel)
            if sentinel in worker_sentinels:
                log.error("an API process exited: stopping the server", process=name)
                return 1
            log.error("an engine process exited: the workers answer 503 until the server is restarted",
                      process=name)


def run_headless(settings: Settings) -> None:
    """vLLM's own headless launcher, over the same engine flags a head would give its engines."""
    from vllm.entrypoints.cli.serve import run_headless as vllm_headless
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from plugins.engine.vllm_engine import CPU_ENGINE_ARGS, engine_environment

    engine_environment(settings)
    argv = settings.engine_argv(CPU_ENGINE_ARGS if current_platform.is_cpu() else ())
    args = make_arg_parser(FlexibleArgumentParser(prog="choir-serve")).parse_args([*argv, "--headless"])
    args.api_server_count = 0  # what `vllm serve --headless` defaults it to: no API process here
    vllm_headless(args)


if __name__ == "__main__":
    main()
