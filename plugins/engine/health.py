"""GET /health and GET /version: the engine's liveness and versions, open to everyone."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from core.errors import APIError
from plugins.engine.config import EngineDependency, EnginesDependency
from plugins.engine.roles import ROLES
from plugins.spec import operation


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
    try:
        choir = package_version("choir")
    except PackageNotFoundError:  # running from a checkout that was not installed
        choir = "unknown"
    return {"version": choir, "vllm": engine.version}


HEALTH_HANDLERS = [health, version]
