"""ParsersPlugin: the reasoning and tool parsers (CHOIR_REASONING_PARSER, CHOIR_TOOL_PARSER), built once the
generation engine has started (the engine provides them: vLLM's own, with its tokenizer) and kept in the app
state under the engine config's key for the pipeline. Their names are checked first of all lifespans,
wherever the plugin is listed: a name vLLM lacks stops start-up with one line, and no engine is left to stop."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.config.app import AppConfig
from litestar.plugins import InitPlugin

from choir.engine.backend import check_parser_names
from choir.plugins.engine.config import EngineConfig


class ParsersPlugin(InitPlugin):
    __slots__ = ("engines", "plugins", "reasoning", "tool")

    def __init__(self, reasoning: str | None, tool: str | None, engines: EngineConfig,
                 plugins: tuple[str, ...] = ()) -> None:
        self.reasoning, self.tool, self.engines, self.plugins = reasoning, tool, engines, plugins

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        if self.reasoning or self.tool:
            app_config.lifespan.insert(0, self._names_known)  # entered before any engine starts
            app_config.on_startup.append(self._build)  # run once every lifespan is entered
        return app_config

    @asynccontextmanager
    async def _names_known(self, app: Litestar) -> AsyncIterator[None]:
        check_parser_names(self.reasoning, self.tool, self.plugins)  # a SettingsError: one line (choir/app/asgi.py)
        yield

    def _build(self, app: Litestar) -> None:
        engine = app.state[self.engines.engine_state_key]
        app.state[self.engines.parsers_state_key] = engine.parsers(self.reasoning, self.tool)
