"""PipelinePlugin: the one dependency a generation handler takes, the data path it drives:
the operation's compatibility rules (spec) → fan-out → engine → aggregation.

One dependency, not four: Litestar resolves sibling dependencies concurrently, in an anyio task
group per request (litestar-org/litestar#4563), which py-spy put at ~6 % of the front end's CPU
per request. Fan-out is configuration (its limits), the engine comes from the state key the
engine plugin's lifespan fills, and the compat rules from the route the spec plugin bound.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from litestar import Request, WebSocket
from litestar.config.app import AppConfig
from litestar.di import NamedDependency, Provide
from litestar.params import SkipValidation
from litestar.plugins import InitPlugin

from choir.core.compat import OperationCompat
from choir.engine.parsing import Parsers
from choir.engine.protocol import Engine
from choir.engine.roles import Engines
from choir.plugins.aggregation import Aggregator
from choir.plugins.audio import AudioPolicy
from choir.plugins.engine.config import EngineConfig
from choir.plugins.fanout import FanOut
from choir.plugins.media import MediaPolicy
from choir.plugins.spec import operation_compat
from choir.plugins.store.plugin import StoreConfig


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    """What the server sets for requests that leave it out (vLLM's front-end flags of the same names)."""

    return_tokens_as_token_ids: bool = False  # --return-tokens-as-token-ids
    force_include_usage: bool = False  # --enable-force-include-usage: every stream has usage, continuous
    response_role: str = "assistant"  # --response-role: the role of a chat answer
    # --default-chat-template-kwargs: what every chat template (and the parsers reading its output) is given,
    # under the request's own chat_template_kwargs
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)


NO_DEFAULTS = RequestDefaults()
NO_MEDIA = MediaPolicy()
NO_AUDIO = AudioPolicy()


@dataclass(frozen=True, slots=True)
class Pipeline:
    compat: OperationCompat
    fan_out: FanOut
    engine: Engine  # generation, LoRA adapters included
    aggregator: Aggregator
    engines: Engines  # every role's engine (choir/engine/roles.py), generation's included
    parsers: Parsers | None = None  # the reasoning and tool parsers (choir/plugins/parsers.py), if any
    defaults: RequestDefaults = NO_DEFAULTS
    media: MediaPolicy = NO_MEDIA  # how images in requests are checked and fetched
    audio: AudioPolicy = NO_AUDIO  # how audio uploads are checked and decoded
    # Where the store is in the app state (choir/plugins/store/), if there is one: read by the stateful calls
    # alone (`stored`), so a plain request pays nothing for it.
    store_key: str | None = None

    def stored(self, request: Request) -> "Store | None":
        return request.app.state.get(self.store_key) if self.store_key is not None else None


if TYPE_CHECKING:
    from choir.plugins.store.store import Store

PipelineDependency = NamedDependency[SkipValidation[Pipeline]]


@dataclass(frozen=True, slots=True)
class SocketPipeline:
    """What a websocket handler (/v1/realtime) takes: the generation engine and the audio policy."""

    engine: Engine
    audio: AudioPolicy


SocketPipelineDependency = NamedDependency[SkipValidation[SocketPipeline]]


class PipelinePlugin(InitPlugin):
    """Provides `pipeline`, from the state the engine plugin's config (`engines`) names."""

    __slots__ = ("audio", "defaults", "engines", "fan_out", "media", "store")

    def __init__(self, fan_out: FanOut, engines: EngineConfig, defaults: RequestDefaults = NO_DEFAULTS,
                 store: StoreConfig | None = None, media: MediaPolicy | None = None,
                 audio: AudioPolicy | None = None) -> None:
        self.fan_out, self.engines, self.defaults, self.store = fan_out, engines, defaults, store
        self.media = media or MediaPolicy()  # its own: a policy's semaphore serves one app
        self.audio = audio or AudioPolicy()

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        fan_out, defaults, media, audio = self.fan_out, self.defaults, self.media, self.audio
        engine_key, engines_key, parsers_key = (self.engines.engine_state_key, self.engines.state_key,
                                                self.engines.parsers_state_key)
        store_key = self.store.state_key if self.store is not None and self.store.url is not None else None

        def provide_pipeline(request: Request) -> Pipeline:
            # Not a `state: State` parameter: Litestar would build a new State (with its lock) per request.
            state = request.app.state
            engine = state[engine_key]
            return Pipeline(operation_compat(request), fan_out, engine, Aggregator(engine), state[engines_key],
                            state.get(parsers_key), defaults, media, audio, store_key)

        def provide_socket_pipeline(socket: WebSocket) -> SocketPipeline:
            return SocketPipeline(socket.app.state[engine_key], audio)

        app_config.dependencies["pipeline"] = Provide(provide_pipeline, sync_to_thread=False)
        app_config.dependencies["socket_pipeline"] = Provide(provide_socket_pipeline, sync_to_thread=False)
        app_config.on_shutdown.append(audio.close)  # its decoding threads
        return app_config
