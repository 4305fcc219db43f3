"""The engine roles Choir serves, and the engines started for them.

A role is one entry here: what its engine does, which endpoints serve it, how its engine starts (vLLM's,
unless a test swaps in a fake). Its model comes from settings of one shape for every role
(choir/core/settings.py `RoleModel`); the engine plugin starts every configured role, one lifecycle for all, and
/health, /v1/models and the GPU-share check go over `Engines`, not over named engines."""

from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import cast

from choir.core.settings import RoleModel, Settings
from choir.engine import backend
from choir.engine.protocol import Engine, PoolingEngine

# How an engine starts: a context manager that yields the engine and stops it on exit.
AnyEngine = Engine | PoolingEngine  # a role's engine: generation's, or a pooling role's
EngineFactory = Callable[[Settings, RoleModel], AbstractAsyncContextManager[AnyEngine]]


def _vllm(settings: Settings, model: RoleModel) -> AbstractAsyncContextManager[AnyEngine]:
    return backend.start_role(settings, model)


@dataclass(frozen=True)
class Role:
    name: str
    does: str  # what its engine does, for messages: "generates text"
    endpoints: str  # where a client sends its model's name
    start: EngineFactory = _vllm


ROLES = {role.name: role for role in (
    Role("generate", "generates text", "POST /v1/chat/completions, /v1/completions and /v1/responses"),
    Role("embed", "embeds text", "POST /v1/embeddings"),
    Role("rerank", "scores query and document pairs", "POST /rerank (/v1/rerank, /v2/rerank) and /score"),
    Role("classify", "classifies text", "POST /classify"),
)}


class Engines:
    """The engines started, by role (the app state the engine plugin's lifespan fills): generation's
    always, each pooling role's when its model is configured."""

    __slots__ = ("_by_name", "_pooling", "by_role", "generate")

    def __init__(self, by_role: dict[str, AnyEngine]) -> None:
        self.by_role = by_role
        # Each role's factory started the engine of its kind: generation's an Engine, the others PoolingEngines.
        self.generate = cast(Engine, by_role["generate"])
        self._pooling = {role: cast(PoolingEngine, engine) for role, engine in by_role.items() if role != "generate"}
        # A served name → its role (generation's adapters are looked up live: they come and go).
        self._by_name = {name: role for role, engine in by_role.items() for name in engine.served_model_names}

    def __iter__(self) -> Iterator[tuple[str, AnyEngine]]:
        return iter(self.by_role.items())

    def pooling(self, role: str) -> PoolingEngine | None:
        return self._pooling.get(role)

    def role_of(self, name: str) -> str | None:
        """The role whose engine serves this model name, if any."""
        role = self._by_name.get(name)
        if role is None and name in self.generate.adapters:
            return "generate"
        return role

    def names(self, role: str) -> tuple[str, ...]:
        if role == "generate":
            return *self.generate.served_model_names, *self.generate.adapters
        engine = self._pooling.get(role)
        return () if engine is None else tuple(engine.served_model_names)

    def unfinished_requests(self) -> int:
        return sum(engine.num_unfinished_requests() for engine in self.by_role.values())
