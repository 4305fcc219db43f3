"""`choir serve`'s command line: `vllm serve`'s, read by vLLM's own parser, plus Choir's own options.

Every option of vLLM's parser is one of four kinds, and a test walks them all (tests/test_cli_flags.py):
- an engine option (AsyncEngineArgs): its tokens reach the engine's parser unchanged, after CHOIR_ENGINE_ARGS;
- a front-end option Choir serves: it sets the Choir setting that does the same (SETTINGS), or uvicorn's own
  option (UVICORN), or is what Choir does anyway (AS_IS);
- one Choir cannot honour (REFUSED): given with a value other than vLLM's default, start-up stops with one line.
A flag wins over the environment: each given option is written over its CHOIR_* variable, and Settings reads
the result as it reads the environment (one place checks every value).
"""

import argparse
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from choir.core.settings import SettingsError
from choir.core.variables import VARIABLES
from choir.engine import backend

# Choir's own settings as flags: (flag, variable); what each means, and whether it is a boolean (with a --no- form),
# is the variable's declaration (choir/core/variables.py).
CHOIR_FLAGS: tuple[tuple[str, str], ...] = (
    *((f"--{name.removeprefix('CHOIR_').lower().replace('_', '-')}", name) for name in (
        "CHOIR_COMPAT", "CHOIR_STORE", "CHOIR_STORE_URL", "CHOIR_STORE_TTL", "CHOIR_PROTECT_DOCS",
        "CHOIR_PROTECT_METRICS", "CHOIR_ALLOW_RUNTIME_LORA", "CHOIR_MAX_N", "CHOIR_MAX_PROMPTS", "CHOIR_MAX_CHOICES",
        "CHOIR_MAX_BODY_BYTES", "CHOIR_MAX_JSON_DEPTH", "CHOIR_MAX_GRAMMAR_BYTES", "CHOIR_GRAMMAR_COMPILE_SECONDS",
        "CHOIR_GRAMMAR_COMPILERS", "CHOIR_DRAIN_SECONDS", "CHOIR_FANOUT_PLACEMENT", "CHOIR_MEDIA_DOMAINS",
        "CHOIR_MAX_IMAGE_BYTES", "CHOIR_MAX_IMAGE_PIXELS", "CHOIR_MEDIA_FETCH_SECONDS", "CHOIR_MAX_AUDIO_BYTES",
        "CHOIR_MAX_AUDIO_SECONDS", "CHOIR_AUDIO_DECODES", "CHOIR_DEV_MODE")),
    *((f"--{role}-{what.lower().replace('_', '-')}", f"CHOIR_{prefix}_{what}")
      for role, prefix in (("embedding", "EMBEDDING"), ("rerank", "RERANK"), ("classify", "CLASSIFY"))
      for what in ("MODEL", "MODEL_NAME", "ENGINE_ARGS")),
)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _joined(value: Sequence[str]) -> str:
    return ",".join(value)


def _boolean(value: bool) -> str:
    return "true" if value else "false"


def _lora(modules: Sequence[Any]) -> str:
    return json.dumps([{"name": m.name, "path": m.path, "base_model_name": m.base_model_name} for m in modules])


# vLLM's log levels that Choir's four have not (the log level is the engines' option too: passed on as well)
LOG_LEVELS = {"critical": "error", "notset": "debug"}
# vLLM's options that set a Choir setting: dest → (variable, how its value is written there).
SETTINGS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "model_tag": ("CHOIR_MODEL", str),
    "model": ("CHOIR_MODEL", str),
    "served_model_name": ("CHOIR_SERVED_MODEL_NAME", _joined),
    "reasoning_parser": ("CHOIR_REASONING_PARSER", str),
    "tool_call_parser": ("CHOIR_TOOL_PARSER", str),
    "tool_parser_plugin": ("CHOIR_TOOL_PARSER_PLUGIN", str),
    "reasoning_parser_plugin": ("CHOIR_REASONING_PARSER_PLUGIN", str),
    "api_key": ("CHOIR_API_KEY", _joined),
    "lora_modules": ("CHOIR_LORA_MODULES", _lora),
    "api_server_count": ("CHOIR_API_SERVERS", str),
    "return_tokens_as_token_ids": ("CHOIR_RETURN_TOKENS_AS_TOKEN_IDS", _boolean),
    "enable_force_include_usage": ("CHOIR_FORCE_INCLUDE_USAGE", _boolean),
    "trust_request_mm_kwargs": ("CHOIR_TRUST_REQUEST_MM_KWARGS", _boolean),
    "chat_template": ("CHOIR_CHAT_TEMPLATE", str),
    "chat_template_content_format": ("CHOIR_CHAT_TEMPLATE_CONTENT_FORMAT", str),
    "default_chat_template_kwargs": ("CHOIR_DEFAULT_CHAT_TEMPLATE_KWARGS", _text),
    "response_role": ("CHOIR_RESPONSE_ROLE", str),
    "max_log_len": ("CHOIR_MAX_LOG_LEN", str),
    "log_level": ("CHOIR_LOG_LEVEL", lambda level: LOG_LEVELS.get(str(level).lower(), str(level).lower())),
    "allowed_origins": ("CHOIR_ALLOWED_ORIGINS", _joined),
    "allowed_methods": ("CHOIR_ALLOWED_METHODS", _joined),
    "allowed_headers": ("CHOIR_ALLOWED_HEADERS", _joined),
    "allow_credentials": ("CHOIR_ALLOW_CREDENTIALS", _boolean),
    "disable_fastapi_docs": ("CHOIR_DOCS", lambda disabled: _boolean(not disabled)),
    "disable_access_log_for_endpoints": ("CHOIR_QUIET_PATHS", str),
}
# vLLM's options that are uvicorn's own: dest → uvicorn.Config's keyword.
UVICORN = {"host": "host", "port": "port", "uds": "uds", "root_path": "root_path", "ssl_keyfile": "ssl_keyfile",
           "ssl_certfile": "ssl_certfile", "ssl_ca_certs": "ssl_ca_certs", "ssl_cert_reqs": "ssl_cert_reqs",
           "ssl_ciphers": "ssl_ciphers", "uvicorn_log_level": "log_level",
           "h11_max_incomplete_event_size": "h11_max_incomplete_event_size"}
# Options whose meaning Choir has whatever they say, or that vLLM's parser itself acts on.
AS_IS = {
    "config": "vLLM's parser reads the file's options in its place",
    "headless": "engine cores only, as vLLM's (passed to the engine's flags)",
    "enable_auto_tool_choice": "Choir serves tool_choice `auto` whenever --tool-call-parser names a parser",
    "enable_prompt_tokens_details": "Choir always reports usage.prompt_tokens_details.cached_tokens",
    "disable_uvicorn_access_log": "Choir logs one line per request itself, never uvicorn's access log",
    "enable_request_id_headers": "Choir always answers with X-Request-Id",
    "enable_offline_docs": "Choir's docs are always served from the package, offline",
    "enable_server_load_tracking": "Choir always serves /load",
    "enable_log_deltas": "Choir never logs outputs (see --enable-log-outputs)",
}
# Options Choir cannot honour: given with another value than vLLM's default, start-up stops naming them.
REFUSED = {
    "grpc": "Choir serves HTTP only",
    "grpc_port": "Choir serves HTTP only",
    "trust_request_chat_template": "Choir never renders a chat template a request brings",
    "exclude_tools_when_tool_choice_none": "Choir renders the tools whatever tool_choice says",
    "tool_strict_level": "Choir has no tool strictness levels",
    "tool_server": "Choir serves no built-in tools",
    "enable_per_request_metrics": "Choir's /metrics has no per-request series",
    "sse_keep_alive_interval": "Choir sends keepalives on Messages streams only (`ping`)",
    "enable_tokenizer_info_endpoint": "Choir serves no /tokenizer_info",
    "enable_log_outputs": "Choir's request log has no bodies",
    "cohere_is_reasoning_model": "Choir serves no Cohere chat API",
    "cohere_format": "Choir serves no Cohere chat API",
    "anthropic_disabled_thinking_effort": "Choir's Messages API has no thinking effort setting",
    "log_error_stack": "Choir logs errors without stacks",
    "enable_scale_out": "Choir scales out with --api-server-count and data parallelism",
    "fingerprint_mode": "Choir's system_fingerprint follows its --compat profile",
    "fingerprint_value": "Choir's system_fingerprint follows its --compat profile",
    "data_parallel_supervisor_port": "Choir runs no data-parallel supervisor of vLLM's",
    "dp_supervisor_probe_interval_s": "Choir runs no data-parallel supervisor of vLLM's",
    "dp_supervisor_probe_timeout_s": "Choir runs no data-parallel supervisor of vLLM's",
    "dp_supervisor_probe_failure_threshold": "Choir runs no data-parallel supervisor of vLLM's",
    "enable_ssl_refresh": "Choir does not reload certificates while running",
    "middleware": "Choir takes no ASGI middleware by import path",
    "h11_max_header_count": "uvicorn has no such limit",
    "enable_flash_late_interaction": "Choir serves no late-interaction scoring",
}
# Engine options Choir sets from its own settings (SETTINGS), never passed as they are.
CHOIR_TAKES = frozenset(("model", "served_model_name", "reasoning_parser", "reasoning_parser_plugin"))


@dataclass(frozen=True)
class CommandLine:
    """What `choir serve ARGS` asks for: the environment Settings reads, and uvicorn's options."""

    environ: dict[str, str]
    uvicorn: dict[str, Any] = field(default_factory=dict)


def parser() -> argparse.ArgumentParser:
    return backend.serve_parser("choir serve", _add_choir_flags)


def _add_choir_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Choir", "Choir's own settings (each also a CHOIR_* environment variable)")
    for flag, variable in CHOIR_FLAGS:
        declared = VARIABLES[variable]
        action: str | type[argparse.Action] = argparse.BooleanOptionalAction if declared.boolean else "store"
        group.add_argument(flag, dest=_dest(variable), action=action, default=None,
                           help=f"{declared.summary} ({variable})")


def _dest(variable: str) -> str:
    return "choir_" + variable.removeprefix("CHOIR_").lower()


def read(argv: Sequence[str], environ: Mapping[str, str]) -> CommandLine:
    """The command line over the environment (a flag wins). SettingsError names an option Choir refuses."""
    command = parser()
    try:
        args = backend.parse_serve_args(command, argv)
    except (ValueError, AssertionError, OSError) as exc:  # vLLM's reading of a --config file, in its own types
        raise SettingsError(f"the command line cannot be read: {exc}") from None
    # vLLM's own checks, with the tool parser CHOIR_TOOL_PARSER names when no flag does
    checked = argparse.Namespace(**vars(args.values))
    checked.tool_call_parser = checked.tool_call_parser or environ.get("CHOIR_TOOL_PARSER") or None
    try:
        backend.check_serve_args(checked)
    except (ValueError, TypeError) as exc:
        raise SettingsError(str(exc).removeprefix("Error: ")) from None
    engine_dests, values = backend.engine_dests(), args.values
    env, uvicorn, engine_tokens = dict(environ), {}, list[str]()
    # Each option once, in the order given; the positional model last, as vLLM's wins over --model
    given = sorted(dict.fromkeys(dest for dest, _ in args.given), key=lambda dest: dest == "model_tag")
    for dest, tokens in args.given:
        if dest in engine_dests and dest not in CHOIR_TAKES:
            engine_tokens.extend(tokens)
    for dest in given:
        value = getattr(values, dest, None)
        if dest in SETTINGS:
            variable, write = SETTINGS[dest]
            env[variable] = write(value)
        elif dest in UVICORN:
            uvicorn[UVICORN[dest]] = value
        elif dest in REFUSED and value != command.get_default(dest):
            option = next(a.option_strings[0] for a in command._actions if a.dest == dest)
            raise SettingsError(f"{option} is not served by Choir: {REFUSED[dest]}.")
        elif dest.startswith("choir_") and value is not None:
            variable = "CHOIR_" + dest.removeprefix("choir_").upper()
            env[variable] = _boolean(value) if isinstance(value, bool) else value
    if "headless" in given and values.headless:
        engine_tokens.append("--headless")
    if engine_tokens:
        env["CHOIR_ENGINE_ARGS"] = " ".join(filter(None, (environ.get("CHOIR_ENGINE_ARGS", ""),
                                                           shlex.join(engine_tokens))))
    return CommandLine(env, uvicorn)
