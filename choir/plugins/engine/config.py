"""The engine plugin's config: it owns the engines' lifespan, their state keys and their providers."""

import asyncio
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog
from litestar import Litestar
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import SkipValidation

from choir.core.settings import Settings
from choir.engine.operator import DEV_MODE_STATE_KEY
from choir.engine.protocol import RUNTIME_LORA_STATE_KEY, Engine
from choir.engine.roles import ROLES, AnyEngine, EngineFactory, Engines

# How handlers ask for the engines: injected by name, and not validated (a Protocol cannot be).
EngineDependency = NamedDependency[SkipValidation[Engine]]
EnginesDependency = NamedDependency[SkipValidation[Engines]]
log = structlog.get_logger("choir.engine")


class ShutdownDrain:
    """On SIGTERM/SIGINT the server stops accepting and lets in-flight requests finish, for at most
    `seconds` (CHOIR_DRAIN_SECONDS); then the engine aborts what is left, and each of those requests
    ends with an error (an error event then [DONE] for a stream), so the server can exit."""

    def __init__(self, engines: list[AnyEngine], seconds: float) -> None:
        self.engines, self.seconds = engines, seconds
        self.previous: dict[int, Any] = {}
        self.timer: asyncio.TimerHandle | None = None

    @property
    def draining(self) -> bool:
        """A signal came: the server is on its way out (not ready for new work)."""
        return self.timer is not None

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
    """The engines' lifecycle, one for every role (choir/engine/roles.py): each configured role's engine
    starts in the lifespan, in the order of `Settings.models` (generation first), and all stop at its end.
    It owns the app-state keys the engines and what is built from them live under; the plugins that read
    them take this config."""

    settings: Settings = field(default_factory=Settings)
    factories: dict[str, EngineFactory] = field(default_factory=dict)  # role → its start; tests swap in fakes
    state_key: str = "engines"  # Engines: every role's engine
    engine_state_key: str = "engine"  # the generation engine alone (the hot path reads it)
    parsers_state_key: str = "parsers"  # the serving side's reasoning and tool parsers (choir/plugins/parsers.py)
    runtime_lora_state_key: str = RUNTIME_LORA_STATE_KEY  # whether adapters may be loaded at run time
    dev_mode_state_key: str = DEV_MODE_STATE_KEY  # whether vLLM's development routes are served
    drain_state_key: str = "drain"  # the ShutdownDrain: whether the server is draining
    dependency_key: str = "engine"
    engines_dependency_key: str = "engines"
    draining_dependency_key: str = "draining"

    @asynccontextmanager
    async def lifespan(self, app: Litestar) -> AsyncIterator[None]:
        async with AsyncExitStack() as started:  # a SettingsError stops what did start (one line: choir/app/asgi.py)
            by_role = {}
            for model in self.settings.models:
                start = self.factories.get(model.role, ROLES[model.role].start)
                by_role[model.role] = await started.enter_async_context(start(self.settings, model))
            engines = Engines(by_role)
            app.state[self.state_key] = engines
            app.state[self.engine_state_key] = engines.generate
            app.state[self.runtime_lora_state_key] = self.settings.allow_runtime_lora
            app.state[self.dev_mode_state_key] = self.settings.dev_mode
            drain = ShutdownDrain(list(by_role.values()), self.settings.drain_seconds)
            drain.install()
            app.state[self.drain_state_key] = drain
            try:
                yield
            finally:
                drain.uninstall()
                for key in (self.state_key, self.engine_state_key, self.parsers_state_key,
                            self.runtime_lora_state_key, self.dev_mode_state_key, self.drain_state_key):
                    app.state.pop(key, None)

    def provide_engine(self, state: State) -> Engine:
        return state[self.engine_state_key]

    def provide_engines(self, state: State) -> Engines:
        return state[self.state_key]

    def provide_draining(self, state: State) -> bool:
        drain = state.get(self.drain_state_key)
        return drain is not None and drain.draining
