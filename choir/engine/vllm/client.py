"""One process's AsyncLLM: the engine cores started here, or attached to as API process i of N
(vLLM's `client_addresses`, `client_count`, `client_index`: the cores a supervisor started, choir/cli/serve.py).

An attached client has no monitor of its engines (vLLM's monitor watches the processes it started), and
neither has any client of a remote engine (a headless node): a SIGKILLed engine says nothing, and its
requests would wait forever. `watch_engine_connections` closes that gap with ZeroMQ's own connection
events on the socket the engines connect to: an engine whose connection drops is dead, and the client
is marked dead as vLLM's own monitor marks it (every in-flight request ends with EngineDeadError).
"""

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import structlog

from choir.core.settings import SettingsError

log = structlog.get_logger("choir.engine")

# What a supervisor hands API process i for one engine role: vLLM's client_config (the ZMQ addresses and
# pre-bound listener sockets, client_count, client_index, the DP coordinator's stats address).
ClientConfig = dict[str, Any]


def client_label(client: ClientConfig | None) -> dict[str, int]:
    return {} if client is None else {"api_server": client["client_index"], "api_servers": client["client_count"]}


def engine_config(engine_args: Any, setting: str, api_server: bool = False) -> Any:
    """vLLM's engine config for these flags; flags the engine refuses (`--data-parallel-size-local 3` of 2,
    external DP for a dense model, Ray on CPU, ...) stop start-up with one line naming the setting."""
    from vllm.usage.usage_lib import UsageContext

    context = UsageContext.OPENAI_API_SERVER if api_server else UsageContext.ENGINE_CONTEXT
    try:
        return engine_args.create_engine_config(usage_context=context)
    except ValueError as exc:  # pydantic's ValidationError is one
        errors = exc.errors() if hasattr(exc, "errors") else None
        reason = "; ".join(str(e["msg"]) for e in errors) if errors else (str(exc).splitlines() or [repr(exc)])[0]
        raise SettingsError(f"{setting}: the engine refuses these flags: {reason}") from None


@asynccontextmanager
async def async_llm(engine_args: Any, client: ClientConfig | None, setting: str) -> AsyncIterator[Any]:
    """`setting`: where the flags came from (CHOIR_ENGINE_ARGS, CHOIR_EMBEDDING_ENGINE_ARGS)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    async with AsyncExitStack() as stack:
        if client is None:
            cpu_thread_binding(engine_args)
            config = engine_config(engine_args, setting)
            engine = AsyncLLM.from_vllm_config(config, enable_log_requests=engine_args.enable_log_requests,
                                               disable_log_stats=engine_args.disable_log_stats)
            stack.callback(engine.shutdown)
        else:
            from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client_from_engine_args

            engine_args._api_process_count = client["client_count"]
            engine_args._api_process_rank = client["client_index"]
            engine = await stack.enter_async_context(
                build_async_engine_client_from_engine_args(engine_args, client_config=client))
        parallel = engine.vllm_config.parallel_config
        if client is not None or parallel.data_parallel_size_local < parallel.data_parallel_size:
            stack.callback(watch_engine_connections(engine).cancel)
        yield engine


def watch_engine_connections(engine: Any) -> "asyncio.Task[None]":
    """A task that marks the client dead when an engine's connection to it drops."""
    import zmq
    from zmq.utils.monitor import parse_monitor_message

    core = engine.engine_core
    monitor = core.input_socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    async def watch() -> None:
        try:
            event = parse_monitor_message(await monitor.recv_multipart())
        except asyncio.CancelledError:
            return
        finally:
            monitor.close(linger=0)
        if core.resources.engine_dead or not core._finalizer.alive:
            return
        log.error("an engine's connection dropped: the engine is dead", endpoint=event["endpoint"].decode())
        core.resources.engine_dead = True  # as vLLM's MPClient monitor does for the engines it started
        core.shutdown()

    return asyncio.get_running_loop().create_task(watch(), name="choir-engine-connections")


def cpu_thread_binding(engine_args: Any) -> None:
    """vLLM-CPU binds each engine's OpenMP threads to cores, but its `auto` binding has no data-parallel
    offset: two local engines would take the same cores. With DP ranks on this machine and no
    VLLM_CPU_OMP_THREADS_BIND given, each rank gets its own share of the CPUs this process may use."""
    from vllm.platforms import current_platform

    local = engine_args.data_parallel_size_local or engine_args.data_parallel_size
    if not current_platform.is_cpu() or local <= 1 or os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return
    # One CPU list per worker of each local rank, in vLLM's [DP, PP, TP] order.
    parts = local * engine_args.pipeline_parallel_size * engine_args.tensor_parallel_size
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // parts)
    lists = [[cpus[(i * share + j) % len(cpus)] for j in range(share)] for i in range(parts)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, cpu_list)) for cpu_list in lists)
    log.info("engine threads bound per data-parallel rank", binding=os.environ["VLLM_CPU_OMP_THREADS_BIND"])
