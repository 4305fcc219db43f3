"""One API process of N (choir/cli/serve.py starts them): uvicorn and the Litestar app on the listening socket the
supervisor bound, over engine cores the supervisor started, attached to as vLLM client i of N.

Signals: uvicorn's own handlers stop accepting, and the engine plugin's drain (CHOIR_DRAIN_SECONDS) lets
in-flight requests finish; the supervisor sends SIGTERM to every worker and waits for the drain. A worker
whose supervisor is gone (SIGKILLed) drains and exits too: no orphan keeps the port."""

import multiprocessing
import os
import signal
import threading
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from choir.core.settings import RoleModel, Settings
from choir.engine import backend
from choir.engine.roles import AnyEngine, EngineFactory


@dataclass(frozen=True)
class WorkerArgs:
    """What every worker gets (pickled once per worker by multiprocessing's spawn)."""

    settings: Settings
    uvicorn: dict[str, Any]  # uvicorn.Config's keyword arguments (root_path, timeouts, ...)
    # Each pooling role's vLLM client_config of each worker (index = client_index). The generation role's
    # comes to each worker as its own `client_config` argument (vLLM's APIServerProcessManager hands it).
    clients: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def run_worker(listen_address: str, sock: Any, args: WorkerArgs, client_config: dict[str, Any]) -> None:
    """vLLM's APIServerProcessManager entry point (`target_server_fn`): same signature as vLLM's own."""
    import structlog
    import uvicorn

    from choir.app.asgi import create_app

    index = client_config["client_index"]
    backend.name_process("APIServer", index)
    client_config.pop("api_server_loads", None)  # vLLM's accept balancing: uvicorn accepts on its own
    mine = {"generate": client_config}
    for role, clients in args.clients.items():
        mine[role] = clients[index]
        for other in clients:  # the other workers' listeners came along in the pickle
            if other is not clients[index]:
                other["input_listener"].close()
                other["output_listener"].close()
    _exit_with_supervisor()
    app = create_app(args.settings, factories={role: _attached(client) for role, client in mine.items()})
    structlog.contextvars.bind_contextvars(api_server=index)  # on each of this worker's log lines
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, **args.uvicorn))
    server.run(sockets=[sock])


def _attached(client: dict[str, Any]) -> EngineFactory:
    def factory(settings: Settings, model: RoleModel) -> AbstractAsyncContextManager[AnyEngine]:
        return backend.start_role(settings, model, client)

    return factory


def _exit_with_supervisor() -> None:
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="choir-supervisor-watch", daemon=True).start()
