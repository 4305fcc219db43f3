"""vLLM's development routes (served only with CHOIR_DEV_MODE, or vLLM's VLLM_SERVER_DEV_MODE; behind the API key):
an engine's caches reset, generation paused and resumed, sleep and wake, the profiler, a method on every worker,
and what the server was started with. Caches, pause, sleep and the profiler act on every role's engine;
`/collective_rpc`, `/server_info` and `/kv_event_sources` on the generation engine, as vLLM's server has one."""

from typing import Any, Literal

from litestar import MediaType, Request, Response
from litestar.params import SkipValidation

from choir.core.errors import APIError
from choir.core.protocol.operator import CollectiveRpcRequest
from choir.engine.operator import DEV_MODE_STATE_KEY, Operator, PauseMode
from choir.engine.roles import Engines
from choir.plugins.engine.config import EngineDependency, EnginesDependency
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation


def _engines(request: Request, engines: Engines) -> list[Operator]:
    """Every role's engine, once the development routes are on."""
    if not request.app.state.get(DEV_MODE_STATE_KEY, False):
        raise APIError(404, f"{request.url.path} is a development route: start the server with CHOIR_DEV_MODE=true "
                            "(or vLLM's VLLM_SERVER_DEV_MODE=1) to serve it.")
    return [engine for _, engine in engines]


def _empty() -> Response:
    return Response(b"", media_type=MediaType.TEXT)


@operation("resetPrefixCache")
async def reset_prefix_cache(request: Request, engines: EnginesDependency, reset_running_requests: bool = False,
                             reset_external: bool = False) -> dict[str, bool]:
    done = [await engine.reset_prefix_cache(reset_running_requests, reset_external)
            for engine in _engines(request, engines)]
    return {"success": all(done)}


@operation("resetMmCache")
async def reset_mm_cache(request: Request, engines: EnginesDependency) -> Response:
    for engine in _engines(request, engines):
        await engine.reset_mm_cache()
    return _empty()


@operation("pauseGeneration")
async def pause(request: Request, engines: EnginesDependency, mode: PauseMode = "abort",
                clear_cache: bool = True) -> dict[str, str]:
    for engine in _engines(request, engines):
        await engine.pause(mode, clear_cache)
    return {"status": "paused"}


@operation("resumeGeneration")
async def resume(request: Request, engines: EnginesDependency) -> dict[str, str]:
    for engine in _engines(request, engines):
        await engine.resume()
    return {"status": "resumed"}


@operation("isPaused")
async def is_paused(request: Request, engines: EnginesDependency) -> dict[str, bool]:
    return {"is_paused": any([await engine.is_paused() for engine in _engines(request, engines)])}


@operation("sleepEngine")
async def sleep(request: Request, engines: EnginesDependency, level: int = 1,
                mode: PauseMode = "abort") -> dict[str, Any]:
    if level not in (0, 1, 2):
        raise APIError(400, f"`level` is {level}: vLLM's sleep levels are 0, 1 and 2.", "level")
    for engine in _engines(request, engines):
        await engine.sleep(level, mode)
    return {"status": "sleeping", "level": level}


@operation("wakeUpEngine")
async def wake_up(request: Request, engines: EnginesDependency) -> dict[str, Any]:
    tags = request.query_params.getall("tags", None) or None
    awake = [await engine.wake_up(tags) for engine in _engines(request, engines)]
    return {"status": "awake" if all(awake) else "sleeping", "tags": tags}


@operation("isSleeping")
async def is_sleeping(request: Request, engines: EnginesDependency) -> dict[str, bool]:
    return {"is_sleeping": any([await engine.is_sleeping() for engine in _engines(request, engines)])}


@operation("startProfile")
async def start_profile(request: Request, engines: EnginesDependency) -> Response:
    for engine in _engines(request, engines):
        await engine.start_profile()
    return _empty()


@operation("stopProfile")
async def stop_profile(request: Request, engines: EnginesDependency) -> Response:
    for engine in _engines(request, engines):
        await engine.stop_profile()
    return _empty()


@operation("collectiveRpc")
async def collective_rpc(data: SkipValidation[CollectiveRpcRequest], request: Request, engines: EnginesDependency,
                         engine: EngineDependency, pipeline: PipelineDependency) -> dict[str, list[Any]]:
    _engines(request, engines)
    body = pipeline.compat.admit(data, CollectiveRpcRequest)
    return {"results": await engine.collective_rpc(body.method, body.timeout, tuple(body.args), body.kwargs)}


@operation("serverInfo")
async def server_info(request: Request, engines: EnginesDependency, engine: EngineDependency,
                      config_format: Literal["text", "json"] = "text") -> dict[str, Any]:
    _engines(request, engines)
    return await engine.server_info(as_json=config_format == "json")


@operation("kvEventSources")
async def kv_event_sources(engine: EngineDependency) -> dict[str, Any]:
    """Where each engine rank publishes its KV-cache events (vLLM's; not a development route): `{}` unless the
    engine was started with --kv-events-config."""
    return engine.kv_event_sources()


OPERATOR_HANDLERS = [reset_prefix_cache, reset_mm_cache, pause, resume, is_paused, sleep, wake_up, is_sleeping,
                     start_profile, stop_profile, collective_rpc, server_info, kv_event_sources]
