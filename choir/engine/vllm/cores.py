"""The engine cores of one role (generation, embeddings), started once for N API processes the way
`vllm serve --api-server-count N` starts them (`vllm/entrypoints/cli/serve.py::run_multi_api_server`):
bind one pair of ZMQ listeners per API process, launch the cores (and the data-parallel coordinator)
with vLLM's `launch_core_engines`, hand API process i its `client_config`, and hand-shake with every
core once the API processes are started. Used by the supervisor (choir/cli/serve.py), never by a worker."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

from choir.engine.vllm.client import ClientConfig, cpu_thread_binding, engine_config

log = structlog.get_logger("choir.engine")


class EngineCores:
    def __init__(self, role: str, engine_args: Any, api_servers: int, setting: str) -> None:
        self.role, self.api_servers = role, api_servers
        engine_args._api_process_count, engine_args._api_process_rank = api_servers, -1
        self.log_stats = not engine_args.disable_log_stats
        cpu_thread_binding(engine_args)
        self.vllm_config = engine_config(engine_args, setting, api_server=True)
        self.manager: Any = None
        self.coordinator: Any = None
        self.listeners: Any = None

    @contextmanager
    def launch(self) -> Iterator[list[ClientConfig]]:
        """Starts the cores; yields one client_config per API process. The block starts the API processes
        and calls `watch`; on leaving it, every core hand-shakes (start-up fails if a watched process
        exits first)."""
        from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
        from vllm.v1.executor import Executor

        self.listeners = bind_engine_zmq_listeners(self.vllm_config, self.api_servers)
        executor = Executor.get_class(self.vllm_config)
        with launch_core_engines(self.vllm_config, executor, self.log_stats, self.listeners.addresses) as launch:
            self._launch, self.manager, self.coordinator = launch, launch.engine_manager, launch.coordinator
            stats = self.coordinator.get_stats_publish_address() if self.coordinator else None
            configs = []
            for i, (inputs, outputs) in enumerate(zip(self.listeners.inputs, self.listeners.outputs, strict=True)):
                config: ClientConfig = {
                    "input_address": inputs.address, "output_address": outputs.address,
                    "input_listener": inputs.socket, "output_listener": outputs.socket,
                    "client_count": self.api_servers, "client_index": i}
                if stats is not None:
                    config["stats_update_address"] = stats
                configs.append(config)
            yield configs
        log.info("engine cores ready", role=self.role, api_servers=self.api_servers,
                 data_parallel_size=self.vllm_config.parallel_config.data_parallel_size)

    def watch(self, processes: list[Any]) -> None:
        self._launch.watched_frontend_processes = processes

    def close_listeners(self) -> None:
        """The supervisor's copies of the listener sockets, once every API process has its own."""
        for listener in (*self.listeners.inputs, *self.listeners.outputs):
            listener.close()

    def sentinels(self) -> dict[Any, str]:
        """What the supervisor waits on, besides its API processes: each local core and the coordinator."""
        found: dict[Any, str] = {}
        if self.manager is not None and hasattr(self.manager, "processes"):
            found.update({proc.sentinel: proc.name for proc in self.manager.processes})
        if self.coordinator is not None:
            found[self.coordinator.proc.sentinel] = "DPCoordinator"
        return found

    def shutdown(self, timeout: float | None) -> None:
        if self.manager is not None:
            self.manager.shutdown(timeout=timeout)
        if self.coordinator is not None:
            self.coordinator.shutdown(timeout=timeout)
        if self.listeners is not None:
            self.listeners.cleanup()
            self.listeners = None  # now, not in its __del__ at interpreter exit
