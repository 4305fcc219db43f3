"""ParsersPlugin: vLLM's reasoning and tool parsers (CHOIR_REASONING_PARSER, CHOIR_TOOL_PARSER), built
on the serving side once the engine has started (they need its tokenizer), and kept in the app state
for the pipeline. Their names are checked before the engine starts: a name vLLM lacks stops start-up
with one line, and no engine is left to stop. List it before the engine plugin."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.config.app import AppConfig
from litestar.exceptions import ImproperlyConfiguredException
from litestar.plugins import InitPlugin

from app.serving.parsers import ParserSet, parser_classes
from plugins.engine.plugin import EnginePlugin
from plugins.pipeline import PARSERS_STATE_KEY


class ParsersPlugin(InitPlugin):
    __slots__ = ("engine_state_key", "reasoning", "tool")

    def __init__(self, reasoning: str | None, tool: str | None, engine_state_key: str = "engine") -> None:
        self.reasoning, self.tool, self.engine_state_key = reasoning, tool, engine_state_key

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        later = app_config.plugins[app_config.plugins.index(self) + 1:]
        if not any(isinstance(plugin, EnginePlugin) for plugin in later):
            raise ImproperlyConfiguredException("ParsersPlugin must come before EnginePlugin: its name check runs "
                                                "before the engine starts, and it builds the parsers after.")
        if self.reasoning or self.tool:
            app_config.lifespan.append(self._names_known)  # entered before the engine plugin's
            app_config.on_startup.append(self._build)  # run once every lifespan is entered
        return app_config

    @asynccontextmanager
    async def _names_known(self, app: Litestar) -> AsyncIterator[None]:
        parser_classes(self.reasoning, self.tool)  # a SettingsError: one line (app/asgi.py)
        yield

    def _build(self, app: Litestar) -> None:
        engine = app.state[self.engine_state_key]
        app.state[PARSERS_STATE_KEY] = ParserSet.load(engine.tokenizer, self.reasoning, self.tool)
