"""The engine plugin's config: it owns the engine's lifespan, its state key and its provider."""

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog
from litestar import Litestar
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import SkipValidation

from core.settings import Settings
from plugins.engine.protocol import RUNTIME_LORA_STATE_KEY, EmbeddingEngine, Engine

EngineFactory = Callable[[Settings], AbstractAsyncContextManager[Any]]
# How handlers ask for the engines: injected by name, and not validated (a Protocol cannot be).
EngineDependency = NamedDependency[SkipValidation[Engine]]
EmbeddingEngineDependency = NamedDependency[SkipValidation[EmbeddingEngine | None]]  # None: no embedding model
log = structlog.get_logger("choir.engine")


def _vllm_engine(settings: Settings) -> AbstractAsyncContextManager[Any]:
    from plugins.engine.vllm_engine import start_vllm_engine  # lazy: vLLM imports torch

    return start_vllm_engine(settings)


def _vllm_embedding_engine(settings: Settings) -> AbstractAsyncContextManager[Any]:
    from plugins.engine.vllm_engine import start_vllm_embedding_engine

    return start_vllm_embedding_engine(settings)


class ShutdownDrain:
    """On SIGTERM/SIGINT the server stops accepting and lets in-flight requests finish, for at most
    `seconds` (CHOIR_DRAIN_SECONDS); then the engine aborts what is left, and each of those requests
    ends with an error (an error event then [DONE] for a stream), so the server can exit."""

    def __init__(self, engines: list[Any], seconds: float) -> None:
        self.engines, self.seconds = engines, seconds
        self.previous: dict[int, Any] = {}
        self.timer: asyncio.TimerHandle | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals belong to the main thread (an in-process test client runs elsewhere)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = self.previous[sig] = signal.getsignal(sig)

            def handler(signum: int, frame: Any, previous: Any = previous) -> None:
                loop.call_soon_threadsafe(self._start)
                if callable(previous):
                    previous(signum, frame)  # uvicorn's own: stop accepting, wait for connections

            signal.signal(sig, handler)

    def uninstall(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)

    def _start(self) -> None:
        if self.timer is None:
            in_flight = sum(engine.num_unfinished_requests() for engine in self.engines)
            log.info("draining", seconds=self.seconds, in_flight=in_flight)
            self.timer = asyncio.get_running_loop().call_later(self.seconds, self._expire)

    def _expire(self) -> None:
        async def abort() -> None:
            aborted = sum([await engine.abort_all() for engine in self.engines])
            log.warning("drain timeout: aborted the requests still running", aborted=aborted)

        self._task = asyncio.ensure_future(abort())


@dataclass
class EngineConfig:
    """The engines' lifecycles: the generation engine, and the embedding engine when
    CHOIR_EMBEDDING_MODEL names a model. Both start in the lifespan and stop at its end."""

    settings: Settings = field(default_factory=Settings)
    factory: EngineFactory = _vllm_engine  # tests swap in a fake engine here
    embedding_factory: EngineFactory = _vllm_embedding_engine
    state_key: str = "engine"
    embedding_state_key: str = "embedding_engine"
    dependency_key: str = "engine"
    embedding_dependency_key: str = "embedding_engine"

    @asynccontextmanager
    async def lifespan(self, app: Litestar) -> AsyncIterator[None]:
        async with AsyncExitStack() as engines:  # a SettingsError stops what did start (one line: app/asgi.py)
            engine = await engines.enter_async_context(self.factory(self.settings))
            embedding = None
            if self.settings.embedding_model is not None:
                embedding = await engines.enter_async_context(self.embedding_factory(self.settings))
            app.state[self.state_key] = engine
            app.state[self.embedding_state_key] = embedding
            app.state[RUNTIME_LORA_STATE_KEY] = self.settings.allow_runtime_lora
            drain = ShutdownDrain([e for e in (engine, embedding) if e is not None], self.settings.drain_seconds)
            drain.install()
            try:
                yield
            finally:
                drain.uninstall()
                app.state.pop(self.state_key, None)
                app.state.pop(self.embedding_state_key, None)

    def provide_engine(self, state: State) -> Engine:
        return state[self.state_key]

    def provide_embedding_engine(self, state: State) -> EmbeddingEngine | None:
        return state.get(self.embedding_state_key)
