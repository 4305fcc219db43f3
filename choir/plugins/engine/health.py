"""The probes a cluster reads, open to everyone as on vLLM's server: liveness (GET /health, and SageMaker's
/ping), readiness (GET /ready), load (GET /load) and versions (GET /version)."""

from collections.abc import Awaitable, Callable

from litestar.datastructures import State

import choir
from choir.core.errors import APIError
from choir.engine.roles import ROLES, Engines
from choir.plugins.engine.config import EngineDependency, EnginesDependency
from choir.plugins.spec import operation

# What else must be ready before new requests come, each a check that raises a 503 saying why (the store registers
# one: migrated, which it tries again on each call while it could not be).
READINESS_STATE_KEY = "readiness"
Readiness = Callable[[], Awaitable[None]]


def _alive(engines: Engines) -> dict[str, str | int]:
    """Every role's engine: a dead one makes the server unhealthy (a restart brings them all back)."""
    for role, engine in engines:
        if not engine.is_alive:
            raise APIError(503, f"The {role} engine is dead: the server cannot serve {ROLES[role].endpoints} "
                                "until it is restarted.")
    return {"status": "ok", "unfinished_requests": engines.unfinished_requests()}


@operation("health")
async def health(engines: EnginesDependency) -> dict[str, str | int]:
    return _alive(engines)


@operation("ping")
async def ping(engines: EnginesDependency) -> dict[str, str | int]:
    return _alive(engines)


@operation("pingPost")
async def ping_post(engines: EnginesDependency) -> dict[str, str | int]:
    return _alive(engines)


@operation("ready")
async def ready(engines: EnginesDependency, draining: bool, state: State) -> dict[str, str]:
    """Live, not on its way out, and what the app registered ready (the store migrated: it was down at start-up,
    say). The app answers only once its lifespan has started every engine."""
    _alive(engines)
    if draining:
        raise APIError(503, "The server is draining (it received SIGTERM): send new requests elsewhere.")
    checks: list[Readiness] = state.get(READINESS_STATE_KEY, [])
    for check in checks:
        await check()
    return {"status": "ready"}


@operation("load")
async def load(engines: EnginesDependency) -> dict[str, int]:
    """vLLM's server load: the engine requests this API process has not finished (each child of an `n > 1`
    request is one)."""
    return {"server_load": engines.unfinished_requests()}


@operation("version")
async def version(engine: EngineDependency) -> dict[str, str]:
    """Choir's version, as `choir --version` says it, and the engine's."""
    return {"version": choir.__version__, "vllm": engine.version}


HEALTH_HANDLERS = [health, ping, ping_post, ready, load, version]
