"""Choir's settings: read once from the environment (and `.env` when present), validated up front.

Every setting is a `CHOIR_*` variable; `.env.example` lists them with their defaults.
Invalid values raise `SettingsError` with one line that names the variable and what to fix.
"""

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Where `choir-tiny-models` (`make install`) builds the bundled tiny models, and where Choir looks for them: models/ in
# the directory Choir is started from (a checkout's, for `make serve`). A model directory built there carries
# BUNDLED_MARKER, which is how Choir knows to give it the tiny models' engine defaults, wherever it lies.
MODELS_DIR = Path("models").absolute()
BUNDLED_MARKER = ".choir-tiny-complete"
BUNDLED_MODEL_DIR = MODELS_DIR / "choir-tiny"
BUNDLED_MODEL_NAME = "choir-tiny"
BUNDLED_LORA_DIR = MODELS_DIR / "choir-tiny-lora"
# A tiny vision-language model (LLaVA-style), built beside it and served only when CHOIR_MODEL names it.
BUNDLED_VLM_DIR = MODELS_DIR / "choir-tiny-vlm"
# A tiny Whisper (speech to text), the same: /v1/audio/transcriptions and /v1/audio/translations.
BUNDLED_SPEECH_DIR = MODELS_DIR / "choir-tiny-whisper"
# A tiny audio-language model (Qwen2-Audio-style), the same: audio parts in chat.
BUNDLED_AUDIO_DIR = MODELS_DIR / "choir-tiny-audio"
# A tiny streaming speech model (Qwen3-ASR-style), the same: /v1/realtime (and /v1/audio/transcriptions).
BUNDLED_REALTIME_DIR = MODELS_DIR / "choir-tiny-realtime"

LOG_LEVELS = ("debug", "info", "warning", "error")
# Stored responses: a SQLite file in .choir/ of the directory Choir is started from.
DEFAULT_STORE_URL = f"sqlite+aiosqlite:///{Path('.choir').absolute() / 'store.sqlite3'}"
DEFAULT_STORE_TTL = 30 * 24 * 3600  # as long as OpenAI keeps a stored response
# Engine flags Choir sets from its own settings (its serving side needs the same values).
OWN_FLAGS = {"--model": "CHOIR_MODEL", "--served-model-name": "CHOIR_SERVED_MODEL_NAME",
             "--reasoning-parser": "CHOIR_REASONING_PARSER",
             "--reasoning-parser-plugin": "CHOIR_REASONING_PARSER_PLUGIN"}
# vLLM's front-end flags Choir reads from CHOIR_ENGINE_ARGS itself (the engine's parser knows neither).
API_SERVER_COUNT_FLAGS = ("--api-server-count", "-asc")
HEADLESS_FLAG = "--headless"
# Where the children of one `n > 1` request run under data parallelism: each where vLLM's balancer puts
# it, or all on one rank (one prefill, one prefix cache). benchmarks/placement.py measures both.
FANOUT_PLACEMENTS = ("spread", "pinned")
# vLLM's --chat-template-content-format: how message content reaches the template (the first: detected).
CONTENT_FORMATS = ("auto", "string", "openai")


class SettingsError(Exception):
    """A setting has a value Choir cannot start with."""


@dataclass(frozen=True)
class LoraModule:
    """A LoRA adapter served under its own model name (vLLM's --lora-modules)."""

    name: str
    path: str
    base_model_name: str | None = None  # the served name /v1/models gives as its `parent` (else the first)


@dataclass(frozen=True)
class PoolingRole:
    """An optional engine role on a pooling model, and its three settings: CHOIR_<PREFIX>_MODEL,
    CHOIR_<PREFIX>_MODEL_NAME and CHOIR_<PREFIX>_ENGINE_ARGS. `make install` builds a tiny one of each."""

    role: str  # the role's name (choir/engine/roles.py): embed, rerank, classify
    prefix: str
    bundled_name: str
    task: str  # the task it runs, as vLLM's pooling runner names it (a cross-encoder's score is a classification)

    @property
    def bundled_dir(self) -> Path:
        return MODELS_DIR / self.bundled_name

    def variable(self, what: str) -> str:
        return f"CHOIR_{self.prefix}_{what}"


POOLING_ROLES = (PoolingRole("embed", "EMBEDDING", "choir-tiny-embed", "embed"),
                 PoolingRole("rerank", "RERANK", "choir-tiny-rerank", "classify"),
                 PoolingRole("classify", "CLASSIFY", "choir-tiny-classify", "classify"))
ROLE_NAMES = ("generate", *(role.role for role in POOLING_ROLES))


@dataclass(frozen=True)
class RoleModel:
    """One engine's model, the same shape for every role: generation's (CHOIR_MODEL,
    CHOIR_SERVED_MODEL_NAME, CHOIR_ENGINE_ARGS) and each pooling role's."""

    role: str  # one of ROLE_NAMES
    model: str
    name: str | None = None  # the served names, comma-separated; None: the bundled name, else the model
    engine_args: tuple[str, ...] = ()

    @property
    def is_bundled(self) -> bool:
        """A tiny model Choir built (`choir-tiny-models`): served with the tiny models' engine defaults."""
        return is_bundled_dir(self.model)

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """One name or several (aliases), comma-separated; the first is reported."""
        names = self.name or (Path(self.model).resolve().name if self.is_bundled else self.model)
        return tuple(name.strip() for name in names.split(",") if name.strip())

    @property
    def variables(self) -> tuple[str, str, str]:
        """The settings this model comes from: model, names, engine flags."""
        if self.role == "generate":
            return "CHOIR_MODEL", "CHOIR_SERVED_MODEL_NAME", "CHOIR_ENGINE_ARGS"
        role = pooling_role(self.role)
        return role.variable("MODEL"), role.variable("MODEL_NAME"), role.variable("ENGINE_ARGS")


def pooling_variable(role: str) -> str:
    """The setting that names a pooling role's model: CHOIR_EMBEDDING_MODEL, ..."""
    return pooling_role(role).variable("MODEL")


def pooling_role(name: str) -> PoolingRole:
    return next(role for role in POOLING_ROLES if role.role == name)


def is_bundled_dir(model: str) -> bool:
    return (Path(model).expanduser() / BUNDLED_MARKER).is_file()


def bundled_model_dir(role: str) -> Path:
    """Where `make install` builds the tiny model of this role."""
    return BUNDLED_MODEL_DIR if role == "generate" else pooling_role(role).bundled_dir


@dataclass(frozen=True)
class Settings:
    model: str = str(BUNDLED_MODEL_DIR)
    served_model_name: str = BUNDLED_MODEL_NAME
    engine_args: tuple[str, ...] = ()
    max_n: int = 128
    max_prompts: int = 1024
    max_choices: int = 1024
    max_body_bytes: int = 16 * 1024 * 1024
    max_file_bytes: int = 200 * 1024 * 1024
    batch_concurrency: int = 4
    max_json_depth: int = 128
    max_grammar_bytes: int = 256 * 1024
    grammar_compile_seconds: int = 10
    grammar_compilers: int = 1
    drain_seconds: int = 30
    # Where stored responses live (an SQLAlchemy async URL); None: nothing is stored (CHOIR_STORE=off).
    store_url: str | None = None
    store_ttl: int | None = None  # seconds a stored response lives (CHOIR_STORE_TTL; 0: until deleted)
    log_level: str = "info"
    compat: str = "sglang"
    api_keys: tuple[str, ...] = ()
    protect_docs: bool = False
    protect_metrics: bool = False
    tool_parser: str | None = None
    # Files that register parsers of their own (vLLM's --tool-parser-plugin and --reasoning-parser-plugin).
    tool_parser_plugin: str | None = None
    reasoning_parser_plugin: str | None = None
    reasoning_parser: str | None = None
    lora_modules: tuple[LoraModule, ...] = ()
    allow_runtime_lora: bool = False
    # vLLM's front-end flags --return-tokens-as-token-ids and --enable-force-include-usage
    return_tokens_as_token_ids: bool = False
    force_include_usage: bool = False
    # Engines on pooling models (embed, rerank, classify), each off unless its model is given.
    pooling: tuple[RoleModel, ...] = ()
    # API processes over the same engine cores (vLLM's --api-server-count): 1 is one process, no supervisor.
    api_servers: int = 1
    headless: bool = False  # engines only, for a head node's data-parallel front end (vLLM's --headless)
    fanout_placement: str = "pinned"
    # Images in requests (choir/plugins/media.py): hosts whose http(s) image URLs are fetched (none: fetching is off),
    # the largest image in bytes and in pixels, how long a fetch may take, and vLLM's --trust-request-mm-kwargs.
    media_domains: tuple[str, ...] = ()
    max_image_bytes: int = 10 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    media_fetch_seconds: int = 10
    trust_request_mm_kwargs: bool = False
    # Audio in requests (choir/plugins/audio.py): the largest upload in bytes, the longest in seconds, decodes at once.
    max_audio_bytes: int = 25 * 1024 * 1024
    max_audio_seconds: int = 600
    audio_decodes: int = 2
    # How chat messages are rendered (vLLM's --chat-template, a file's path or the template itself; its content
    # format; chat_template_kwargs every request gets under its own).
    chat_template: str | None = None
    response_role: str = "assistant"  # vLLM's --response-role: a chat answer's role
    chat_template_content_format: str = "auto"
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    # vLLM's --max-log-len: with --enable-log-requests (an engine flag), how much of each prompt is logged.
    max_log_len: int | None = None
    # CORS (vLLM's --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials): off while no
    # origin is allowed.
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    dev_mode: bool = False  # vLLM's development routes (choir/app/routes/operator.py): VLLM_SERVER_DEV_MODE
    docs: bool = True  # /schema (the spec and Swagger UI); off: vLLM's --disable-fastapi-docs
    quiet_paths: tuple[str, ...] = ()  # requests to these paths are counted, not logged (vLLM's
    # --disable-access-log-for-endpoints)
    # The environment with .env merged in: the engine takes its VLLM_* variables from here.
    environ: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def generation(self) -> RoleModel:
        return RoleModel("generate", self.model, self.served_model_name, self.engine_args)

    @property
    def models(self) -> tuple[RoleModel, ...]:
        """Every engine's model, generation's first: the engines Choir starts."""
        return self.generation, *self.pooling

    @property
    def parser_plugins(self) -> tuple[str, ...]:
        return tuple(filter(None, (self.tool_parser_plugin, self.reasoning_parser_plugin)))

    @property
    def is_bundled_model(self) -> bool:
        return self.generation.is_bundled

    @property
    def served_model_names(self) -> tuple[str, ...]:
        return self.generation.served_model_names

    def role(self, name: str) -> RoleModel | None:
        """The pooling role's model, if it is configured."""
        return next((model for model in self.pooling if model.role == name), None)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, env_file: Path | None = None) -> "Settings":
        env = environment(environ, env_file)

        model = env.get("CHOIR_MODEL") or str(BUNDLED_MODEL_DIR)
        bundled = Path(model).resolve() in (BUNDLED_MODEL_DIR, BUNDLED_VLM_DIR, BUNDLED_SPEECH_DIR, BUNDLED_AUDIO_DIR)
        if (model.startswith((".", "/", "~")) or bundled) and not Path(model).expanduser().is_dir():
            hint = (" Build the bundled tiny models with `choir-tiny-models` (a checkout's `make install` does), or "
                    "name a model: `choir serve MODEL`.") if bundled else ""
            raise SettingsError(f"CHOIR_MODEL={model!r} is not a directory.{hint}")
        default_name = Path(model).resolve().name if is_bundled_dir(model) else model
        served_model_name = env.get("CHOIR_SERVED_MODEL_NAME") or default_name
        engine_args = _engine_flags(env, "CHOIR_ENGINE_ARGS", OWN_FLAGS)
        engine_args, api_servers, headless = _front_end_flags(env, engine_args)
        placement = env.get("CHOIR_FANOUT_PLACEMENT") or "pinned"
        if placement not in FANOUT_PLACEMENTS:
            raise SettingsError(f"CHOIR_FANOUT_PLACEMENT={placement!r} is not one of {', '.join(FANOUT_PLACEMENTS)}.")
        log_level = env.get("CHOIR_LOG_LEVEL", "info").lower()
        if log_level not in LOG_LEVELS:
            raise SettingsError(f"CHOIR_LOG_LEVEL={log_level!r} is not one of {', '.join(LOG_LEVELS)}.")
        settings = cls(
            model=str(Path(model).expanduser()) if Path(model).expanduser().is_dir() else model,
            served_model_name=served_model_name,
            engine_args=engine_args,
            max_n=_positive_int(env, "CHOIR_MAX_N", 128),
            max_prompts=_positive_int(env, "CHOIR_MAX_PROMPTS", 1024),
            max_choices=_positive_int(env, "CHOIR_MAX_CHOICES", 1024),
            max_body_bytes=_positive_int(env, "CHOIR_MAX_BODY_BYTES", 16 * 1024 * 1024),
            max_file_bytes=_positive_int(env, "CHOIR_MAX_FILE_BYTES", 200 * 1024 * 1024),
            batch_concurrency=_positive_int(env, "CHOIR_BATCH_CONCURRENCY", 4),
            max_json_depth=_positive_int(env, "CHOIR_MAX_JSON_DEPTH", 128),
            max_grammar_bytes=_positive_int(env, "CHOIR_MAX_GRAMMAR_BYTES", 256 * 1024),
            grammar_compile_seconds=_positive_int(env, "CHOIR_GRAMMAR_COMPILE_SECONDS", 10),
            grammar_compilers=_positive_int(env, "CHOIR_GRAMMAR_COMPILERS", 1),
            drain_seconds=_positive_int(env, "CHOIR_DRAIN_SECONDS", 30),
            store_url=_store_url(env),
            store_ttl=_store_ttl(env),
            log_level=log_level,
            compat=env.get("CHOIR_COMPAT") or "sglang",
            # vLLM's own variable too: a `vllm serve` deployment that keeps its key there stays protected
            api_keys=tuple(key.strip() for key in (env.get("CHOIR_API_KEY") or env.get("VLLM_API_KEY") or "").split(",")
                           if key.strip()),
            protect_docs=_boolean(env, "CHOIR_PROTECT_DOCS", False),
            protect_metrics=_boolean(env, "CHOIR_PROTECT_METRICS", False),
            tool_parser=env.get("CHOIR_TOOL_PARSER") or None,
            tool_parser_plugin=_file(env, "CHOIR_TOOL_PARSER_PLUGIN"),
            reasoning_parser_plugin=_file(env, "CHOIR_REASONING_PARSER_PLUGIN"),
            reasoning_parser=env.get("CHOIR_REASONING_PARSER") or None,
            lora_modules=_lora_modules(env.get("CHOIR_LORA_MODULES", "")),
            allow_runtime_lora=_boolean(env, "CHOIR_ALLOW_RUNTIME_LORA", False),
            return_tokens_as_token_ids=_boolean(env, "CHOIR_RETURN_TOKENS_AS_TOKEN_IDS", False),
            force_include_usage=_boolean(env, "CHOIR_FORCE_INCLUDE_USAGE", False),
            pooling=_pooling_models(env),
            api_servers=api_servers,
            headless=headless,
            fanout_placement=placement,
            media_domains=tuple(host.strip().lower() for host in env.get("CHOIR_MEDIA_DOMAINS", "").split(",")
                                if host.strip()),
            max_image_bytes=_positive_int(env, "CHOIR_MAX_IMAGE_BYTES", 10 * 1024 * 1024),
            max_image_pixels=_positive_int(env, "CHOIR_MAX_IMAGE_PIXELS", 40_000_000),
            media_fetch_seconds=_positive_int(env, "CHOIR_MEDIA_FETCH_SECONDS", 10),
            trust_request_mm_kwargs=_boolean(env, "CHOIR_TRUST_REQUEST_MM_KWARGS", False),
            max_audio_bytes=_positive_int(env, "CHOIR_MAX_AUDIO_BYTES", 25 * 1024 * 1024),
            max_audio_seconds=_positive_int(env, "CHOIR_MAX_AUDIO_SECONDS", 600),
            audio_decodes=_positive_int(env, "CHOIR_AUDIO_DECODES", 2),
            chat_template=env.get("CHOIR_CHAT_TEMPLATE") or None,
            response_role=env.get("CHOIR_RESPONSE_ROLE") or "assistant",
            chat_template_content_format=_choice(env, "CHOIR_CHAT_TEMPLATE_CONTENT_FORMAT", CONTENT_FORMATS),
            default_chat_template_kwargs=_json_object(env, "CHOIR_DEFAULT_CHAT_TEMPLATE_KWARGS"),
            max_log_len=_log_len(env),
            allowed_origins=_listed(env, "CHOIR_ALLOWED_ORIGINS", ()),
            allowed_methods=_listed(env, "CHOIR_ALLOWED_METHODS", ("*",)),
            allowed_headers=_listed(env, "CHOIR_ALLOWED_HEADERS", ("*",)),
            allow_credentials=_boolean(env, "CHOIR_ALLOW_CREDENTIALS", False),
            docs=_boolean(env, "CHOIR_DOCS", True),
            # vLLM's own variable too, as a `vllm serve` deployment sets it
            dev_mode=_boolean(env, "CHOIR_DEV_MODE", _boolean(env, "VLLM_SERVER_DEV_MODE", False)),
            quiet_paths=_listed(env, "CHOIR_QUIET_PATHS", ()),
            environ=env,
        )
        settings.check_model_names()
        if settings.api_servers > 1 and settings.allow_runtime_lora:
            raise SettingsError(
                f"CHOIR_ALLOW_RUNTIME_LORA=true needs CHOIR_API_SERVERS=1 (it is {settings.api_servers}): each API "
                "process keeps its own list of adapters, so a load would be served by one process only. "
                "Serve adapters with CHOIR_LORA_MODULES instead.")
        if settings.headless and settings.api_servers > 1:
            raise SettingsError("--headless in CHOIR_ENGINE_ARGS runs engines only: CHOIR_API_SERVERS must be 1.")
        return settings

    def check_model_names(self) -> None:
        """Every model name means one model: a name served twice would hide one of them."""
        names: dict[str, tuple[str, ...]] = {}
        for model in self.models:
            _, name_variable, _ = model.variables
            if not model.served_model_names:
                raise SettingsError(f"{name_variable}={model.name!r} names no model.")
            names[name_variable] = model.served_model_names
        names["CHOIR_LORA_MODULES"] = tuple(module.name for module in self.lora_modules)
        seen: dict[str, str] = {}
        for setting, served in names.items():
            for name in served:
                if name in seen:
                    where = "twice" if seen[name] == setting else f"in {seen[name]} too"
                    raise SettingsError(f"{setting} names `{name}` {where}: a model name must mean one model. "
                                        f"Choose another name (CHOIR_<ROLE>_MODEL_NAME names a pooling model).")
                seen[name] = setting
        for module in self.lora_modules:
            if module.base_model_name is not None and module.base_model_name not in self.served_model_names:
                raise SettingsError(f"CHOIR_LORA_MODULES: the base_model_name of `{module.name}` is "
                                    f"`{module.base_model_name}`, which is not a served name "
                                    f"({', '.join(self.served_model_names)}).")


def _lora_modules(raw: str) -> tuple[LoraModule, ...]:
    """vLLM's --lora-modules forms: `name=path,...`; a JSON object {"name", "path", "base_model_name"};
    or a JSON list of them."""
    raw = raw.strip()
    if not raw:
        return ()
    if raw.startswith(("[", "{")):
        try:
            items = json.loads(raw)
            entries = [LoraModule(**item) for item in (items if isinstance(items, list) else [items])]
            if not all(isinstance(e.name, str) and isinstance(e.path, str) and
                       isinstance(e.base_model_name, str | None) for e in entries):
                raise TypeError("not strings")
        except (ValueError, TypeError):
            raise SettingsError('CHOIR_LORA_MODULES is not a JSON object {"name": ..., "path": ...} (with an '
                                'optional "base_model_name"), nor a list of them.') from None
    else:
        pairs = [part.split("=", 1) for part in raw.split(",") if part.strip()]
        if any(len(pair) != 2 for pair in pairs):
            bad = next(pair for pair in pairs if len(pair) != 2)
            raise SettingsError(f"CHOIR_LORA_MODULES entry {bad[0].strip()!r} is not name=path.")
        entries = [LoraModule(name, path) for name, path in pairs]
    modules = []
    for entry in entries:
        name, path = entry.name.strip(), entry.path.strip()
        if not name or not path:
            raise SettingsError(f"CHOIR_LORA_MODULES entry {name or '?'}={path or '?'} is not name=path.")
        if path.startswith((".", "/", "~")) and not Path(path).expanduser().is_dir():
            raise SettingsError(f"CHOIR_LORA_MODULES: {name}={path} is not a directory.")
        modules.append(LoraModule(name, str(Path(path).expanduser()) if path.startswith("~") else path,
                                  entry.base_model_name))
    if len({m.name for m in modules}) != len(modules):
        raise SettingsError("CHOIR_LORA_MODULES names an adapter twice.")
    return tuple(modules)


def _pooling_models(env: dict[str, str]) -> tuple[RoleModel, ...]:
    models = []
    for role in POOLING_ROLES:
        model, name = env.get(role.variable("MODEL")) or None, env.get(role.variable("MODEL_NAME")) or None
        flags = _engine_flags(env, role.variable("ENGINE_ARGS"), {"--model": role.variable("MODEL"),
                                                                  "--served-model-name": role.variable("MODEL_NAME")})
        if model is None:
            if name or flags:
                raise SettingsError(f"{role.variable('MODEL_NAME')} and {role.variable('ENGINE_ARGS')} need "
                                    f"{role.variable('MODEL')}: the model they are about.")
            continue
        if model.startswith((".", "/", "~")) and not Path(model).expanduser().is_dir():
            hint = " Build it with `choir-tiny-models`." if Path(model).resolve() == role.bundled_dir else ""
            raise SettingsError(f"{role.variable('MODEL')}={model!r} is not a directory.{hint}")
        models.append(RoleModel(role.role, model, name, flags))
    return tuple(models)


def _engine_flags(env: dict[str, str], name: str, own: dict[str, str]) -> tuple[str, ...]:
    try:
        flags = tuple(shlex.split(env.get(name, "")))
    except ValueError as exc:
        raise SettingsError(f"{name} cannot be split into flags: {exc}.") from None
    for flag, setting in own.items():
        if any(arg == flag or arg.startswith(flag + "=") for arg in flags):
            raise SettingsError(f"{name} must not contain {flag}: set {setting} instead.")
    return flags


def _front_end_flags(env: dict[str, str], flags: tuple[str, ...]) -> tuple[tuple[str, ...], int, bool]:
    """CHOIR_API_SERVERS (or --api-server-count N in CHOIR_ENGINE_ARGS, the same) and --headless: taken out
    of the engine's flags."""
    count, headless, kept = None, False, []
    args = iter(flags)
    for arg in args:
        name, _, value = arg.partition("=")
        if name in API_SERVER_COUNT_FLAGS:
            count = value if value else next(args, "")
        elif arg == HEADLESS_FLAG:
            headless = True
        else:
            kept.append(arg)
    api_servers = _positive_int(env, "CHOIR_API_SERVERS", 1)
    if count is not None:
        if not count:
            raise SettingsError("CHOIR_ENGINE_ARGS: --api-server-count needs a number of API processes.")
        from_flag = _positive_int({"CHOIR_ENGINE_ARGS --api-server-count": count},
                                  "CHOIR_ENGINE_ARGS --api-server-count", 1)
        if env.get("CHOIR_API_SERVERS") and from_flag != api_servers:
            raise SettingsError(f"CHOIR_API_SERVERS={api_servers} and --api-server-count {from_flag} in "
                                "CHOIR_ENGINE_ARGS disagree: set one of them.")
        api_servers = from_flag
    return tuple(kept), api_servers, headless


def _store_url(env: dict[str, str]) -> str | None:
    """CHOIR_STORE=off: no store. CHOIR_STORE_URL, else a SQLite file in the project (shared by the API
    processes of one host)."""
    if not _boolean(env, "CHOIR_STORE", True):
        return None
    url = env.get("CHOIR_STORE_URL") or DEFAULT_STORE_URL
    if not url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        raise SettingsError(f"CHOIR_STORE_URL={url!r} is not an async SQLAlchemy URL Choir serves: use "
                            "sqlite+aiosqlite:///path/to/file.sqlite3 or postgresql+asyncpg://user:pass@host/db.")
    return url


def _store_ttl(env: dict[str, str]) -> int | None:
    raw = env.get("CHOIR_STORE_TTL")
    if raw in (None, ""):
        return DEFAULT_STORE_TTL
    try:
        ttl = int(raw)
    except ValueError:
        raise SettingsError(f"CHOIR_STORE_TTL={raw!r} is not a number of seconds.") from None
    if ttl < 0:
        raise SettingsError(f"CHOIR_STORE_TTL={raw!r} must be 0 (keep until deleted) or more seconds.")
    return ttl or None


def _file(env: dict[str, str], name: str) -> str | None:
    path = env.get(name)
    if not path:
        return None
    if not Path(path).expanduser().is_file():
        raise SettingsError(f"{name}={path!r} is not a file.")
    return str(Path(path).expanduser())


def environment(environ: dict[str, str] | None = None, env_file: Path | None = None) -> dict[str, str]:
    """The environment with `.env` (in the directory Choir starts in) merged under it: the real one wins."""
    env = dict(os.environ if environ is None else environ)
    env_file = Path(".env") if env_file is None else env_file
    if env_file.is_file():
        from dotenv import dotenv_values

        for key, value in dotenv_values(env_file).items():
            if value is not None:
                env.setdefault(key, value)
    return env


def _log_len(env: dict[str, str]) -> int | None:
    """vLLM's --max-log-len: None logs whole prompts, 0 none of them."""
    raw = env.get("CHOIR_MAX_LOG_LEN")
    if raw in (None, ""):
        return None
    if not raw.isdigit():
        raise SettingsError(f"CHOIR_MAX_LOG_LEN={raw!r} is not a number of characters (0 or more).")
    return int(raw)


def _choice(env: dict[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = env.get(name) or choices[0]
    if value not in choices:
        raise SettingsError(f"{name}={value!r} is not one of {', '.join(choices)}.")
    return value


def _json_object(env: dict[str, str], name: str) -> dict[str, Any]:
    raw = env.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise SettingsError(f"{name}={raw!r} is not a JSON object.")
    return value


def _listed(env: dict[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """Comma-separated, or a JSON list (as vLLM's flags take it)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if raw.startswith("["):
        try:
            items = json.loads(raw)
        except ValueError:
            items = None
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise SettingsError(f"{name}={raw!r} is not a JSON list of strings.")
        return tuple(items)
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def _positive_int(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer.") from None
    if value < 1:
        raise SettingsError(f"{name}={raw!r} must be at least 1.")
    return value


def _boolean(env: dict[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (use true or false).")
