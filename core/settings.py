"""Choir's settings: read once from the environment (and `.env` when present), validated up front.

Every setting is a `CHOIR_*` variable; `.env.example` lists them with their defaults.
Invalid values raise `SettingsError` with one line that names the variable and what to fix.
"""

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_MODEL_DIR = PROJECT_ROOT / "models" / "choir-tiny"
BUNDLED_MODEL_NAME = "choir-tiny"
BUNDLED_LORA_DIR = PROJECT_ROOT / "models" / "choir-tiny-lora"
BUNDLED_EMBEDDING_DIR = PROJECT_ROOT / "models" / "choir-tiny-embed"
BUNDLED_EMBEDDING_NAME = "choir-tiny-embed"

# Engine flags for the bundled tiny model: small context and batch keep the CPU KV cache
# (VLLM_CPU_KVCACHE_SPACE, GiB) small, and CUDA graphs are pointless for it.
BUNDLED_MODEL_ENGINE_ARGS = ("--max-model-len", "2048", "--max-num-seqs", "128", "--enforce-eager")
# JSON with no whitespace between tokens, so that a model cannot loop on it (vLLM allows any amount by
# default; app/serving/json_bounds.py says the rest). Any --structured-outputs-config flag of the user's
# replaces both (the flag needs the xgrammar or guidance backend).
STRUCTURED_OUTPUT_ENGINE_ARGS = ("--structured-outputs-config.backend", "xgrammar",
                                 "--structured-outputs-config.disable_any_whitespace", "true")
BUNDLED_EMBEDDING_ENGINE_ARGS = ("--max-model-len", "512", "--max-num-seqs", "64", "--enforce-eager")
LOG_LEVELS = ("debug", "info", "warning", "error")
# Engine flags Choir sets from its own settings (its serving side needs the same values).
OWN_FLAGS = {"--model": "CHOIR_MODEL", "--served-model-name": "CHOIR_SERVED_MODEL_NAME",
             "--reasoning-parser": "CHOIR_REASONING_PARSER"}
EMBEDDING_OWN_FLAGS = {"--model": "CHOIR_EMBEDDING_MODEL", "--served-model-name": "CHOIR_EMBEDDING_MODEL_NAME"}
# vLLM's front-end flags Choir reads from CHOIR_ENGINE_ARGS itself (the engine's parser knows neither).
API_SERVER_COUNT_FLAGS = ("--api-server-count", "-asc")
HEADLESS_FLAG = "--headless"
# Where the children of one `n > 1` request run under data parallelism: each where vLLM's balancer puts
# it, or all on one rank (one prefill, one prefix cache). benchmarks/placement.py measures both.
FANOUT_PLACEMENTS = ("spread", "pinned")


class SettingsError(Exception):
    """A setting has a value Choir cannot start with."""


@dataclass(frozen=True)
class LoraModule:
    """A LoRA adapter served under its own model name (vLLM's --lora-modules)."""

    name: str
    path: str
    base_model_name: str | None = None  # the served name /v1/models gives as its `parent` (else the first)


@dataclass(frozen=True)
class Settings:
    model: str = str(BUNDLED_MODEL_DIR)
    served_model_name: str = BUNDLED_MODEL_NAME
    engine_args: tuple[str, ...] = ()
    max_n: int = 128
    max_prompts: int = 1024
    max_choices: int = 1024
    max_body_bytes: int = 16 * 1024 * 1024
    max_json_depth: int = 128
    max_grammar_bytes: int = 256 * 1024
    grammar_compile_seconds: int = 10
    grammar_compilers: int = 1
    drain_seconds: int = 30
    log_level: str = "info"
    compat: str = "sglang"
    api_keys: tuple[str, ...] = ()
    protect_docs: bool = False
    protect_metrics: bool = False
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    lora_modules: tuple[LoraModule, ...] = ()
    allow_runtime_lora: bool = False
    # vLLM's front-end flags --return-tokens-as-token-ids and --enable-force-include-usage
    return_tokens_as_token_ids: bool = False
    force_include_usage: bool = False
    # A second engine for /v1/embeddings (vLLM's pooling runner), off unless a model is given.
    embedding_model: str | None = None
    embedding_model_name: str | None = None
    embedding_engine_args: tuple[str, ...] = ()
    # API processes over the same engine cores (vLLM's --api-server-count): 1 is one process, no supervisor.
    api_servers: int = 1
    headless: bool = False  # engines only, for a head node's data-parallel front end (vLLM's --headless)
    fanout_placement: str = "pinned"
    # The environment with .env merged in: the engine takes its VLLM_* variables from here.
    environ: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_bundled_model(self) -> bool:
        return Path(self.model).resolve() == BUNDLED_MODEL_DIR

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """CHOIR_SERVED_MODEL_NAME is one name or several (aliases), comma-separated; the first is reported."""
        return tuple(name.strip() for name in self.served_model_name.split(",") if name.strip())

    @property
    def embedding_model_names(self) -> tuple[str, ...]:
        if self.embedding_model is None:
            return ()
        bundled = Path(self.embedding_model).resolve() == BUNDLED_EMBEDDING_DIR
        names = self.embedding_model_name or (BUNDLED_EMBEDDING_NAME if bundled else self.embedding_model)
        return tuple(name.strip() for name in names.split(",") if name.strip())

    def engine_argv(self, platform_defaults: tuple[str, ...] = ()) -> list[str]:
        """The engine's flags in vLLM CLI syntax: Choir's defaults first, so the user's win."""
        model_defaults = BUNDLED_MODEL_ENGINE_ARGS if self.is_bundled_model else ()
        # The engine's structured outputs must know the reasoning parser to constrain only what follows
        # the reasoning (json_schema, forced tools), as `vllm serve --reasoning-parser` does.
        reasoning = ("--reasoning-parser", self.reasoning_parser) if self.reasoning_parser else ()
        structured = () if any(arg.startswith("--structured-outputs-config") for arg in self.engine_args) \
            else STRUCTURED_OUTPUT_ENGINE_ARGS
        defaults = _not_overridden([*platform_defaults, *model_defaults, *structured], self.engine_args)
        lora = ("--enable-lora",) if (self.lora_modules or self.allow_runtime_lora) else ()
        return ["--model", self.model, "--served-model-name", *self.served_model_names,
                *_not_overridden(list(lora), self.engine_args), *defaults, *reasoning, *self.engine_args]

    def embedding_engine_argv(self) -> list[str]:
        """The embedding engine's flags: vLLM's pooling runner (a Llama-shaped embedder would otherwise
        be taken for a generator), the bundled model's small context, then CHOIR_EMBEDDING_ENGINE_ARGS."""
        assert self.embedding_model is not None
        bundled = BUNDLED_EMBEDDING_ENGINE_ARGS if Path(self.embedding_model).resolve() == BUNDLED_EMBEDDING_DIR \
            else ()
        defaults = _not_overridden(["--runner", "pooling", *bundled], self.embedding_engine_args)
        return ["--model", self.embedding_model, "--served-model-name", *self.embedding_model_names, *defaults,
                *self.embedding_engine_args]

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, env_file: Path | None = None) -> "Settings":
        env = dict(os.environ if environ is None else environ)
        env_file = PROJECT_ROOT / ".env" if env_file is None else env_file
        if env_file.is_file():
            from dotenv import dotenv_values

            for key, value in dotenv_values(env_file).items():
                if value is not None:
                    env.setdefault(key, value)  # the real environment wins over .env

        model = env.get("CHOIR_MODEL") or str(BUNDLED_MODEL_DIR)
        bundled = Path(model).resolve() == BUNDLED_MODEL_DIR
        if (model.startswith((".", "/", "~")) or bundled) and not Path(model).expanduser().is_dir():
            hint = " Run `make install` to build the bundled model." if bundled else ""
            raise SettingsError(f"CHOIR_MODEL={model!r} is not a directory.{hint}")
        default_name = BUNDLED_MODEL_NAME if bundled else model
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
            max_json_depth=_positive_int(env, "CHOIR_MAX_JSON_DEPTH", 128),
            max_grammar_bytes=_positive_int(env, "CHOIR_MAX_GRAMMAR_BYTES", 256 * 1024),
            grammar_compile_seconds=_positive_int(env, "CHOIR_GRAMMAR_COMPILE_SECONDS", 10),
            grammar_compilers=_positive_int(env, "CHOIR_GRAMMAR_COMPILERS", 1),
            drain_seconds=_positive_int(env, "CHOIR_DRAIN_SECONDS", 30),
            log_level=log_level,
            compat=env.get("CHOIR_COMPAT") or "sglang",
            api_keys=tuple(key.strip() for key in env.get("CHOIR_API_KEY", "").split(",") if key.strip()),
            protect_docs=_boolean(env, "CHOIR_PROTECT_DOCS", False),
            protect_metrics=_boolean(env, "CHOIR_PROTECT_METRICS", False),
            tool_parser=env.get("CHOIR_TOOL_PARSER") or None,
            reasoning_parser=env.get("CHOIR_REASONING_PARSER") or None,
            lora_modules=_lora_modules(env.get("CHOIR_LORA_MODULES", "")),
            allow_runtime_lora=_boolean(env, "CHOIR_ALLOW_RUNTIME_LORA", False),
            return_tokens_as_token_ids=_boolean(env, "CHOIR_RETURN_TOKENS_AS_TOKEN_IDS", False),
            force_include_usage=_boolean(env, "CHOIR_FORCE_INCLUDE_USAGE", False),
            embedding_model=_embedding_model(env.get("CHOIR_EMBEDDING_MODEL") or None),
            embedding_model_name=env.get("CHOIR_EMBEDDING_MODEL_NAME") or None,
            embedding_engine_args=_engine_flags(env, "CHOIR_EMBEDDING_ENGINE_ARGS", EMBEDDING_OWN_FLAGS),
            api_servers=api_servers,
            headless=headless,
            fanout_placement=placement,
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
        names = {"CHOIR_SERVED_MODEL_NAME": self.served_model_names}
        if not names["CHOIR_SERVED_MODEL_NAME"]:
            raise SettingsError(f"CHOIR_SERVED_MODEL_NAME={self.served_model_name!r} names no model.")
        if self.embedding_model is None:
            if self.embedding_model_name or self.embedding_engine_args:
                raise SettingsError("CHOIR_EMBEDDING_MODEL_NAME and CHOIR_EMBEDDING_ENGINE_ARGS need "
                                    "CHOIR_EMBEDDING_MODEL: the embedding model they are about.")
        elif not self.embedding_model_names:
            raise SettingsError(f"CHOIR_EMBEDDING_MODEL_NAME={self.embedding_model_name!r} names no model.")
        else:
            names["CHOIR_EMBEDDING_MODEL_NAME"] = self.embedding_model_names
        names["CHOIR_LORA_MODULES"] = tuple(module.name for module in self.lora_modules)
        seen: dict[str, str] = {}
        for setting, served in names.items():
            for name in served:
                if name in seen:
                    where = "twice" if seen[name] == setting else f"in {seen[name]} too"
                    raise SettingsError(f"{setting} names `{name}` {where}: a model name must mean one model. "
                                        f"Choose another name (CHOIR_EMBEDDING_MODEL_NAME names the embedding model).")
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


def _embedding_model(model: str | None) -> str | None:
    if model is not None and model.startswith((".", "/", "~")) and not Path(model).expanduser().is_dir():
        hint = " Run `make install` to build the bundled one." if Path(model).resolve() == BUNDLED_EMBEDDING_DIR \
            else ""
        raise SettingsError(f"CHOIR_EMBEDDING_MODEL={model!r} is not a directory.{hint}")
    return model


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


def _flag_name(arg: str) -> str:
    """`--no-enable-x`, `--enable_x=1` → `enable-x`: the setting a flag is about."""
    name = arg.split("=", 1)[0].removeprefix("--").replace("_", "-")
    return name.removeprefix("no-")


def _not_overridden(defaults: list[str], user_args: tuple[str, ...]) -> list[str]:
    """Choir's default flags, less those the user sets (vLLM would warn of duplicate keys)."""
    overridden = {_flag_name(arg) for arg in user_args if arg.startswith("--")}
    kept: list[str] = []
    for i, arg in enumerate(defaults):
        flag = arg if arg.startswith("--") else defaults[i - 1]  # a value belongs to the flag before it
        if _flag_name(flag) not in overridden:
            kept.append(arg)
    return kept


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
