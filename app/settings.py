"""Choir's settings: read once from the environment (and `.env` when present), validated up front.

Every setting is a `CHOIR_*` variable; `.env.example` lists them with their defaults.
Invalid values raise `SettingsError` with one line that names the variable and what to fix.
"""

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_MODEL_DIR = PROJECT_ROOT / "models" / "choir-tiny"
BUNDLED_MODEL_NAME = "choir-tiny"

# Engine flags for the bundled tiny model: small context and batch keep the CPU KV cache
# (VLLM_CPU_KVCACHE_SPACE, GiB) small, and CUDA graphs are pointless for it.
BUNDLED_MODEL_ENGINE_ARGS = ("--max-model-len", "2048", "--max-num-seqs", "128", "--enforce-eager")
LOG_LEVELS = ("debug", "info", "warning", "error")
# Engine flags Choir sets from its own settings (its serving side needs the same values).
OWN_FLAGS = {"--model": "CHOIR_MODEL", "--served-model-name": "CHOIR_SERVED_MODEL_NAME",
             "--reasoning-parser": "CHOIR_REASONING_PARSER"}


class SettingsError(ValueError):
    """A setting has a value Choir cannot start with."""


@dataclass(frozen=True)
class Settings:
    model: str = str(BUNDLED_MODEL_DIR)
    served_model_name: str = BUNDLED_MODEL_NAME
    engine_args: tuple[str, ...] = ()
    max_n: int = 128
    max_prompts: int = 1024
    max_choices: int = 1024
    max_body_bytes: int = 16 * 1024 * 1024
    drain_seconds: int = 30
    log_level: str = "info"
    compat: str = "sglang"
    api_keys: tuple[str, ...] = ()
    protect_docs: bool = False
    protect_metrics: bool = False
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    # The environment with .env merged in: the engine takes its VLLM_* variables from here.
    environ: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_bundled_model(self) -> bool:
        return Path(self.model).resolve() == BUNDLED_MODEL_DIR

    def engine_argv(self, platform_defaults: tuple[str, ...] = ()) -> list[str]:
        """The engine's flags in vLLM CLI syntax: Choir's defaults first, so the user's win."""
        model_defaults = BUNDLED_MODEL_ENGINE_ARGS if self.is_bundled_model else ()
        # The engine's structured outputs must know the reasoning parser to constrain only what follows
        # the reasoning (json_schema, forced tools), as `vllm serve --reasoning-parser` does.
        reasoning = ("--reasoning-parser", self.reasoning_parser) if self.reasoning_parser else ()
        defaults = _not_overridden([*platform_defaults, *model_defaults], self.engine_args)
        return ["--model", self.model, "--served-model-name", self.served_model_name,
                *defaults, *reasoning, *self.engine_args]

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
        try:
            engine_args = tuple(shlex.split(env.get("CHOIR_ENGINE_ARGS", "")))
        except ValueError as exc:
            raise SettingsError(f"CHOIR_ENGINE_ARGS cannot be split into flags: {exc}.") from None
        for flag, setting in OWN_FLAGS.items():
            if any(arg == flag or arg.startswith(flag + "=") for arg in engine_args):
                raise SettingsError(f"CHOIR_ENGINE_ARGS must not contain {flag}: set {setting} instead.")
        log_level = env.get("CHOIR_LOG_LEVEL", "info").lower()
        if log_level not in LOG_LEVELS:
            raise SettingsError(f"CHOIR_LOG_LEVEL={log_level!r} is not one of {', '.join(LOG_LEVELS)}.")
        return cls(
            model=str(Path(model).expanduser()) if Path(model).expanduser().is_dir() else model,
            served_model_name=served_model_name,
            engine_args=engine_args,
            max_n=_positive_int(env, "CHOIR_MAX_N", 128),
            max_prompts=_positive_int(env, "CHOIR_MAX_PROMPTS", 1024),
            max_choices=_positive_int(env, "CHOIR_MAX_CHOICES", 1024),
            max_body_bytes=_positive_int(env, "CHOIR_MAX_BODY_BYTES", 16 * 1024 * 1024),
            drain_seconds=_positive_int(env, "CHOIR_DRAIN_SECONDS", 30),
            log_level=log_level,
            compat=env.get("CHOIR_COMPAT") or "sglang",
            api_keys=tuple(key.strip() for key in env.get("CHOIR_API_KEY", "").split(",") if key.strip()),
            protect_docs=_boolean(env, "CHOIR_PROTECT_DOCS", False),
            protect_metrics=_boolean(env, "CHOIR_PROTECT_METRICS", False),
            tool_parser=env.get("CHOIR_TOOL_PARSER") or None,
            reasoning_parser=env.get("CHOIR_REASONING_PARSER") or None,
            environ=env,
        )


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
