"""EnginePlugin: wires the engines' lifespan, dependencies and health routes into the app."""

from litestar.config.app import AppConfig
from litestar.di import Provide
from litestar.plugins import InitPlugin

from choir.plugins.engine.config import EngineConfig
from choir.plugins.engine.health import HEALTH_HANDLERS


class EnginePlugin(InitPlugin):
    __slots__ = ("config",)

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        app_config.lifespan.append(self.config.lifespan)
        app_config.dependencies[self.config.dependency_key] = Provide(self.config.provide_engine, sync_to_thread=False)
        app_config.dependencies[self.config.engines_dependency_key] = Provide(self.config.provide_engines,
                                                                              sync_to_thread=False)
        app_config.dependencies[self.config.draining_dependency_key] = Provide(self.config.provide_draining,
                                                                               sync_to_thread=False)
        app_config.route_handlers.extend(HEALTH_HANDLERS)
        return app_config
