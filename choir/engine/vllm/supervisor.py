"""N API processes over one set of engine cores per role, the way `vllm serve --api-server-count N` runs
them (choir/cli/serve.py is the command): bind the one listening socket, start each role's cores
(choir/engine/vllm/cores.py), then N workers through vLLM's APIServerProcessManager, each attached to
every role's cores as client i of N. /metrics merges every worker (prometheus_client's multiprocess mode).
SIGTERM/SIGINT: every worker drains, then the engines stop. A worker that dies takes the server down
(exit 1), engines included. Also `--headless`: engine cores only, run by vLLM's own code."""

import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from multiprocessing import connection
from typing import Any

import structlog

from choir.core.settings import Settings
from choir.engine.vllm.args import check_gpu_share, engine_argv, parse_role_args
from choir.engine.vllm.client import ClientConfig
from choir.engine.vllm.start import engine_environment

# SIGTERM reaches the workers, which drain for CHOIR_DRAIN_SECONDS; this much more for the rest of their exit.
EXIT_MARGIN_SECONDS = 15
log = structlog.get_logger("choir.serve")

# A worker's arguments, from each pooling role's clients (role → one client_config per API process; vLLM's
# APIServerProcessManager hands each worker its generation client itself).
WorkerArgsFactory = Callable[[dict[str, list[ClientConfig]]], Any]


def supervise(settings: Settings, host: str, port: int, run_worker: Callable[..., None],
              worker_args: WorkerArgsFactory) -> int:
    """Returns the exit code: 0 after a signal, 1 when a worker died. `run_worker` has vLLM's
    `target_server_fn` signature (choir/cli/worker.py)."""
    from vllm.entrypoints.launchers.launcher import create_server_socket
    from vllm.platforms import current_platform
    from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus
    from vllm.v1.utils import APIServerProcessManager

    from choir.engine.vllm.cores import EngineCores

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
    on_cpu = current_platform.is_cpu()
    sock = create_server_socket((host, port), reuse_port=True)
    if not on_cpu:
        check_gpu_share(settings)
    roles = [EngineCores(model.role, parse_role_args(settings, model, on_cpu), n, model.variables[2])
             for model in settings.models]
    workers: Any = None
    code = 0
    try:
        with ExitStack() as starting:  # leaving it: every role's cores hand-shake (the last role's first)
            clients = {role.role: starting.enter_context(role.launch()) for role in roles}
            generation = roles[0]
            workers = APIServerProcessManager(
                listen_address=f"http://{host}:{port}", sock=sock,
                args=worker_args({role: configs for role, configs in clients.items() if role != "generate"}),
                num_servers=n, input_listeners=generation.listeners.inputs,
                output_listeners=generation.listeners.outputs, target_server_fn=run_worker,
                stats_update_address=clients["generate"][0].get("stats_update_address"))
            for role in roles:
                role.watch(workers.processes)
            for role in roles[1:]:
                role.close_listeners()
        sock.close()  # every worker has its own copy
        log.info("serving", url=f"http://{host}:{port}", api_servers=n, roles=[role.role for role in roles],
                 pids=[p.pid for p in workers.processes])
        code = _wait(workers.processes, roles)
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


def _wait(workers: list[Any], roles: list[Any]) -> int:
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

    engine_environment(settings)
    argv = engine_argv(settings, on_cpu=current_platform.is_cpu())
    args = make_arg_parser(FlexibleArgumentParser(prog="choir-serve")).parse_args([*argv, "--headless"])
    args.api_server_count = 0  # what `vllm serve --headless` defaults it to: no API process here
    vllm_headless(args)


def name_process(name: str, index: int) -> None:
    """VLLM::APIServer_i, as vLLM names its own API processes."""
    from vllm.utils.system_utils import set_process_title

    set_process_title(name, str(index))
