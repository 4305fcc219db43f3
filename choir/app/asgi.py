"""create_app(): the Litestar application. Cheap to build (`litestar run` builds it twice):
the engine starts in the lifespan and vLLM is imported only there."""

import sys
from typing import Any

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.exceptions import HTTPException

from choir.app.docs import docs_assets_router, openapi_config
from choir.app.errors import exception_handler
from choir.app.request_log import configure_logging, watch_request
from choir.app.requests import request_class
from choir.app.routes import ROUTE_HANDLERS
from choir.app.routes.batches import RUNNER_STATE_KEY
from choir.app.serving.batch_runner import BatchRunnerPlugin
from choir.core.errors import APIError
from choir.core.settings import Settings, SettingsError
from choir.engine.roles import EngineFactory
from choir.plugins.audio import AudioPolicy
from choir.plugins.auth import AuthConfig, AuthPlugin
from choir.plugins.engine.config import EngineConfig
from choir.plugins.engine.plugin import EnginePlugin
from choir.plugins.fanout import FanOut
from choir.plugins.media import MediaPolicy
from choir.plugins.metrics import MetricsPlugin
from choir.plugins.parsers import ParsersPlugin
from choir.plugins.pipeline import PipelinePlugin, RequestDefaults
from choir.plugins.spec import SpecConfig, SpecPlugin, load_spec
from choir.plugins.store.plugin import StoreConfig, StorePlugin


class ChoirApp(Litestar):
    """Litestar, served below a root path too (uvicorn's --root-path, vLLM's): uvicorn puts the root path
    before the request's path, and a proxy that keeps the prefix sends it too; either way the route path
    (`/llm/llm/v1/models`, `/llm/v1/models` → `/v1/models`) is what is routed and protected. Also: the
    lifespan's setting errors in one line, and every HTTP request watched (its log line, its counters)."""

    quiet_paths: frozenset[str] = frozenset()  # requests counted, never logged (--disable-access-log-for-endpoints)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await one_line_startup_failure(super().__call__, scope, receive, send)
            return
        root = scope.get("root_path", "")
        if root:
            path = scope["path"]
            while path.startswith(root + "/"):
                path = path[len(root):]
            # Exactly one root in front: Litestar's router routes what follows the root's first occurrence
            # (a root also inside the route path, `/llm` in `/v1/models/llm-7b`, would cut it there).
            scope = {**scope, "path": root + path, "raw_path": (root + path).encode()}
        if scope["type"] == "http":
            await watch_request(scope, receive, send, super().__call__, self.quiet_paths)
        else:
            await super().__call__(scope, receive, send)


async def one_line_startup_failure(app: Any, scope: Any, receive: Any, send: Any) -> None:
    """A bad setting the lifespan finds (a parser's name, an engine flag) stops start-up with one line,
    `choir: …`, as the settings checked when the app is built do, not with Litestar's traceback. Raised, never
    `os._exit`: the lifespans' `finally` blocks run, and an in-process runner (a test) gets the SettingsError."""
    failed = None

    async def send_or_hold(message: Any) -> None:
        nonlocal failed
        if message["type"] == "lifespan.startup.failed":
            failed = message  # Litestar's, with the formatted traceback; sent once we know what failed
        else:
            await send(message)

    try:
        await app(scope, receive, send_or_hold)
    except BaseException as exc:
        setting = _settings_error(exc)
        if setting is not None:
            print(f"choir: {setting}", file=sys.stderr, flush=True)
            failed = {"type": "lifespan.startup.failed", "message": ""}
        raise
    finally:
        if failed is not None:
            await send(failed)


def _settings_error(exc: BaseException) -> SettingsError | None:
    """The SettingsError in `exc`: itself, or inside the exception group Litestar's lifespan task group raises."""
    if isinstance(exc, SettingsError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        return next(filter(None, map(_settings_error, exc.exceptions)), None)
    return None


def cors(settings: Settings) -> CORSConfig | None:
    """vLLM's --allowed-origins and its companions: no CORS headers while no origin is allowed."""
    if not settings.allowed_origins:
        return None
    methods: Any = list(settings.allowed_methods)  # "*" or method names, as Litestar's CORSConfig takes them
    return CORSConfig(allow_origins=list(settings.allowed_origins), allow_methods=methods,
                      allow_headers=list(settings.allowed_headers), allow_credentials=settings.allow_credentials)


def create_app(settings: Settings | None = None, engine_factory: EngineFactory | None = None,
               spec: SpecConfig | None = None, factories: dict[str, EngineFactory] | None = None) -> Litestar:
    """`engine_factory` starts the generation engine, `factories` any role's (choir/engine/roles.py); by
    default, vLLM's."""
    if settings is None:
        try:
            settings = Settings.from_env()
        except SettingsError as exc:
            raise SystemExit(f"choir: {exc}") from None
    configure_logging(settings.log_level)
    factories = dict(factories or {})
    if engine_factory is not None:
        factories["generate"] = engine_factory
    if "generate" not in factories and (settings.api_servers > 1 or settings.headless):
        # One process here (`litestar run`, `uvicorn --factory app.asgi:create_app`): the supervisor that
        # starts N workers over one set of engine cores, or headless engines, is choir/cli/serve.py.
        what = "--headless" if settings.headless else f"CHOIR_API_SERVERS={settings.api_servers}"
        raise SystemExit(f"choir: {what} needs `choir-serve` (`make serve`): `litestar run` and uvicorn run "
                         f"Choir as one API process.")
    spec = spec or SpecConfig(compat=settings.compat)
    engine = EngineConfig(settings=settings, factories=factories)
    store = StoreConfig(settings.store_url, settings.store_ttl, keyed=bool(settings.api_keys),
                        max_file_bytes=settings.max_file_bytes)
    try:
        _ = spec.operation_rules  # a bad or unknown CHOIR_COMPAT profile stops start-up here, in one line
    except SettingsError as exc:
        raise SystemExit(f"choir: {exc}") from None
    app = ChoirApp(
        route_handlers=[*ROUTE_HANDLERS, docs_assets_router()] if settings.docs else ROUTE_HANDLERS,
        # The data path (the pipeline): fan-out → engine → aggregation. SpecPlugin last: it binds every handler.
        plugins=[AuthPlugin(AuthConfig(settings.api_keys, settings.protect_docs, settings.protect_metrics)),
                 ParsersPlugin(settings.reasoning_parser, settings.tool_parser, engine, settings.parser_plugins),
                 PipelinePlugin(FanOut(settings.max_n, settings.max_prompts, settings.max_choices,
                                       settings.fanout_placement), engine,
                                RequestDefaults(settings.return_tokens_as_token_ids, settings.force_include_usage,
                                                settings.response_role, settings.default_chat_template_kwargs),
                                store, MediaPolicy(settings.media_domains, settings.max_image_bytes,
                                                   settings.max_image_pixels, settings.media_fetch_seconds,
                                                   settings.trust_request_mm_kwargs),
                                AudioPolicy(settings.max_audio_bytes, settings.max_audio_seconds,
                                            settings.audio_decodes)),
                 EnginePlugin(engine), StorePlugin(store),
                 *([BatchRunnerPlugin(store.state_key, engine.engine_state_key, engine.drain_state_key,
                                      settings.batch_concurrency, RUNNER_STATE_KEY)]
                   if store.url is not None else []),
                 MetricsPlugin(), SpecPlugin(spec)],
        exception_handlers={HTTPException: exception_handler, APIError: exception_handler,
                            Exception: exception_handler},
        openapi_config=openapi_config(load_spec(spec.spec_dir)) if settings.docs else None,
        request_max_body_size=settings.max_body_bytes,
        cors_config=cors(settings),
        request_class=request_class(settings.max_json_depth),
    )
    app.quiet_paths = frozenset(settings.quiet_paths)
    return app

