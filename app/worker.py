"""One API process of N (app/serve.py starts them): uvicorn and the Litestar app on the listening socket the
supervisor bound, over engine cores the supervisor started, attached to as vLLM client i of N.

Signals: uvicorn's own handlers stop accepting, and the engine plugin's drain (CHOIR_DRAIN_SECONDS) lets
in-flight requests finish; the supervisor sends SIGTERM to every worker and waits for the drain. A worker
whose supervisor is gone (SIGKILLed) drains and exits too: no orphan keeps the port."""

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from core.settings import Settings


@dataclass(frozen=True)
class WorkerArgs:
    """What every worker gets (pickled once per worker by multiprocessing's spawn)."""

    settings: Settings
    uvicorn: dict[str, Any]  # uvicorn.Config's keyword arguments (root_path, timeouts, ...)
    # The embedding engine's client_config of each worker (index = client_index), if it has one.
    embedding_clients: tuple[dict[str, Any], ...] = ()


def run_worker(listen_address: str, sock: Any, args: WorkerArgs, client_config: dict[str, Any]) -> None:
    """vLLM's APIServerProcessManager entry point (`target_server_fn`): same signature as vLLM's own."""
    import structlog
    import uvicorn
    from vllm.utils.system_utils import set_process_title

    from app.asgi import create_app

    set_process_title("APIServer", str(client_config["client_index"]))  # VLLM::APIServer_i, as vLLM's
    client_config.pop("api_server_loads", None)  # vLLM's accept balancing: uvicorn accepts on its own
    index = client_config["client_index"]
    embedding = args.embedding_clients[index] if args.embedding_clients else None
    for other in args.embedding_clients:  # the other workers' listeners came along in the pickle
        if other is not embedding:
            other["input_listener"].close()
            other["output_listener"].close()
    _exit_with_supervisor()
    app = create_app(args.settings, engine_factory=_attached("start_vllm_engine", client_config),
                     embedding_factory=_attached("start_vllm_embedding_engine", embedding))
    structlog.contextvars.bind_contextvars(api_server=index)  # on each of this worker's log lines
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, **args.uvicorn))
    server.run(sockets=[sock])


def _attached(start: str, client: dict[str, Any] | None) -> Callable[[Settings], AbstractAsyncContextManager[Any]]:
    def factory(settings: Settings) -> AbstractAsyncContextManager[Any]:
        from plugins.engine import vllm_engine  # lazy: vLLM imports torch

        return getattr(vllm_engine, start)(settings, client)

    return factory


def _exit_with_supervisor() -> None:
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="choir-supervisor-watch", daemon=True).start()
