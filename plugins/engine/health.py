"""GET /health and GET /version: the engine's liveness and versions, open to everyone."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from app.errors import APIError
from plugins.engine.protocol import EngineDependency
from plugins.spec import operation


@operation("health")
async def health(engine: EngineDependency) -> dict[str, str | int]:
    if not engine.is_alive:
        raise APIError(503, "The engine is dead; the server cannot generate until it is restarted.")
    return {"status": "ok", "unfinished_requests": engine.num_unfinished_requests()}


@operation("version")
async def version(engine: EngineDependency) -> dict[str, str]:
    try:
        choir = package_version("choir")
    except PackageNotFoundError:  # running from a checkout that was not installed
        choir = "unknown"
    return {"version": choir, "vllm": engine.version}


HEALTH_HANDLERS = [health, version]
