"""The engine plugin's config: it owns the engine's lifespan, its state key and its provider."""

import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import structlog
from litestar import Litestar
from litestar.datastructures import State

from app.settings import Settings, SettingsError
from plugins.engine.protocol import Engine

EngineFactory = Callable[[Settings], AbstractAsyncContextManager[Engine]]
log = structlog.get_logger("choir.engine")


def _vllm_engine(settings: Settings) -> AbstractAsyncContextManager[Engine]:
    from plugins.engine.vllm_engine import start_vllm_engine  # lazy: vLLM imports torch

    return start_vllm_engine(settings)


@dataclass
class EngineConfig:
    settings: Settings = field(default_factory=Settings)
    factory: EngineFactory = _vllm_engine  # tests swap in a fake engine here
    state_key: str = "engine"
    dependency_key: str = "engine"

    @asynccontextmanager
    async def lifespan(self, app: Litestar) -> AsyncIterator[None]:
        try:
            context = self.factory(self.settings)
            engine = await context.__aenter__()
        except SettingsError as exc:
            # Litestar would hand uvicorn a formatted traceback; a bad setting deserves one
            # line. Nothing has started yet, so there is nothing to clean up.
            print(f"choir: {exc}", file=sys.stderr, flush=True)
            os._exit(2)
        app.state[self.state_key] = engine
        try:
            yield
        finally:
            app.state.pop(self.state_key, None)
            await context.__aexit__(*sys.exc_info())

    def provide_engine(self, state: State) -> Engine:
        return state[self.state_key]
