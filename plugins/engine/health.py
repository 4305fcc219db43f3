"""GET /health and GET /version: the engine's liveness and versions, open to everyone."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from core.errors import APIError
from plugins.engine.config import EmbeddingEngineDependency, EngineDependency
from plugins.spec import operation


@operation("health")
async def health(engine: EngineDependency, embedding_engine: EmbeddingEngineDependency) -> dict[str, str | int]:
    """Both engines: a dead embedding engine makes the server unhealthy too (a restart brings both back)."""
    if not engine.is_alive:
        raise APIError(503, "The engine is dead; the server cannot generate until it is restarted.")
    if embedding_engine is not None and not embedding_engine.is_alive:
        raise APIError(503, "The embedding engine is dead; the server cannot embed until it is restarted.")
    unfinished = engine.num_unfinished_requests()
    if embedding_engine is not None:
        unfinished += embedding_engine.num_unfinished_requests()
    return {"status": "ok", "unfinished_requests": unfinished}


@operation("version")
async def version(engine: EngineDependency) -> dict[str, str]:
    try:
        choir = package_version("choir")
    except PackageNotFoundError:  # running from a checkout that was not installed
        choir = "unknown"
    return {"version": choir, "vllm": engine.version}


HEALTH_HANDLERS = [health, version]
