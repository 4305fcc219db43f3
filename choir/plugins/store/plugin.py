"""StorePlugin: the response store's lifecycle, wired into the app (SQLAlchemy is imported only when a store
is configured and the app starts). advanced-alchemy's config owns the
engine and its session maker (its lifespan creates the tables and disposes of the engine); this plugin adds
that lifespan and puts a `ResponseStore` in the app state under the config's key. Nothing runs per request
unless a request is stateful: no session is opened for a plain one (no before-send hook, no dependency)."""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.config.app import AppConfig
from litestar.plugins import InitPlugin

from choir.plugins.engine.health import READINESS_STATE_KEY


@dataclass
class StoreConfig:
    url: str | None  # an SQLAlchemy async URL (sqlite+aiosqlite:///..., postgresql+asyncpg://...); None: no store
    ttl: int | None = None  # seconds a stored response lives (None: until deleted)
    keyed: bool = False  # the server has API keys: each key sees only what it stored
    max_file_bytes: int = 200 * 1024 * 1024  # the largest file /v1/files takes
    state_key: str = "store"
    _alchemy: Any = field(default=None, init=False, repr=False)

    @property
    def alchemy(self) -> Any:
        """advanced-alchemy's config, built on first use (it imports SQLAlchemy)."""
        if self._alchemy is None:
            from advanced_alchemy.extensions.litestar import AsyncSessionConfig, EngineConfig, SQLAlchemyAsyncConfig

            from choir.plugins.store.models import StoreBase

            # Rows outlive their session: what a call read or wrote is answered after it is committed. A pooled
            # connection is tried before use: after a database restart the first call finds a fresh one, not a 503.
            self._alchemy = SQLAlchemyAsyncConfig(connection_string=self.url, metadata=StoreBase.metadata,
                                                  session_config=AsyncSessionConfig(expire_on_commit=False),
                                                  engine_config=EngineConfig(pool_pre_ping=True),
                                                  set_default_exception_handler=False)
        return self._alchemy

    @asynccontextmanager
    async def lifespan(self, app: Litestar) -> AsyncIterator[None]:
        from choir.plugins.store.batches import BatchStore
        from choir.plugins.store.conversations import ConversationStore
        from choir.plugins.store.files import FileStore
        from choir.plugins.store.responses import ResponseStore
        from choir.plugins.store.store import Store
        from choir.plugins.store.tables import StoreUnavailable

        async with self.alchemy.lifespan(app):
            sessions, prepared = self.alchemy.create_session_maker(), _Once(self._prepare)
            files = FileStore(sessions, self.ttl, self.keyed, prepared)
            files.max_bytes = self.max_file_bytes
            store = Store(ResponseStore(sessions, self.ttl, self.keyed, prepared),
                          ConversationStore(sessions, self.ttl, self.keyed, prepared), files,
                          BatchStore(sessions, self.ttl, self.keyed, prepared))
            try:
                await store.responses.ready()
                await store.files.evict()  # a file may have its own expiry, with no store TTL
                if self.ttl:
                    await store.responses.evict()
                    await store.conversations.evict()
            except StoreUnavailable:
                pass  # logged; the stateful calls answer 503 and try again, the rest is served as usual
            app.state[self.state_key] = store
            readiness = app.state.setdefault(READINESS_STATE_KEY, [])
            readiness.append(store.responses.ready)  # not ready until migrated (a 503 while it cannot be)
            try:
                yield
            finally:
                await store.runs.stop()
                app.state.pop(self.state_key, None)
                readiness.remove(store.responses.ready)

    async def _prepare(self) -> None:
        """The tables, migrated to the newest revision (choir/plugins/store/migrate.py; and, for SQLite, its directory
        and WAL mode: one file, several API processes)."""
        from choir.plugins.store.migrate import upgrade

        if self.url is not None and self.url.startswith("sqlite+aiosqlite:///"):
            Path(self.url.removeprefix("sqlite+aiosqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        if self.url is not None and self.url.startswith("sqlite"):
            async with self.alchemy.get_engine().begin() as connection:
                await connection.exec_driver_sql("PRAGMA journal_mode=WAL")
        await upgrade(self.alchemy.get_engine())


class _Once:
    """The tables made once for every store of this app (again only after a failure)."""

    def __init__(self, prepare: Callable[[], Awaitable[None]]) -> None:
        self.prepare, self.done = prepare, False

    async def __call__(self) -> None:
        if not self.done:
            await self.prepare()
            self.done = True


class StorePlugin(InitPlugin):
    __slots__ = ("config",)

    def __init__(self, config: StoreConfig) -> None:
        self.config = config

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        if self.config.url is not None:
            app_config.lifespan.append(self.config.lifespan)
        return app_config
