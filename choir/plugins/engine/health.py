"""GET /health and GET /version: the engine's liveness and versions, open to everyone."""

import choir
from choir.core.errors import APIError
from choir.engine.roles import ROLES
from choir.plugins.engine.config import EngineDependency, EnginesDependency
from choir.plugins.spec import operation


@operation("health")
async def health(engines: EnginesDependency) -> dict[str, str | int]:
    """Every role's engine: a dead one makes the server unhealthy (a restart brings them all back)."""
    for role, engine in engines:
        if not engine.is_alive:
            raise APIError(503, f"The {role} engine is dead: the server cannot serve {ROLES[role].endpoints} "
                                "until it is restarted.")
    return {"status": "ok", "unfinished_requests": engines.unfinished_requests()}


@operation("version")
async def version(engine: EngineDependency) -> dict[str, str]:
    """Choir's version, as `choir --version` says it, and the engine's."""
    return {"version": choir.__version__, "vllm": engine.version}


HEALTH_HANDLERS = [health, version]
