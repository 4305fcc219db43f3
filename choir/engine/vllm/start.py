"""Starting an engine role over vLLM's AsyncLLM: in this process, or attached to engine cores a supervisor
started (choir/cli/serve.py). Imported only inside the lifespan: vLLM pulls in torch (seconds)."""

import gc
import os
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import structlog

from choir.core.settings import RoleModel, Settings, SettingsError
from choir.core.variables import VLLM_DEFAULTS
from choir.engine.protocol import AdapterError, Engine, PoolingEngine
from choir.engine.vllm.args import check_gpu_share, parse_role_args
from choir.engine.vllm.client import ClientConfig, async_llm, client_label
from choir.engine.vllm.version import check_vllm_version

log = structlog.get_logger("choir.engine")

# Engine processes talk over ZMQ: keep that on loopback. CPU KV cache in GiB: vLLM-CPU's
# default reservation fails on small machines.
ENGINE_ENVIRONMENT = {variable.name: variable.default for variable in VLLM_DEFAULTS}


def settle_after_startup() -> None:
    """What vLLM's own processes do once started. Freeze what start-up allocated (vLLM, torch,
    tokenizers: hundreds of thousands of objects), so that no full collection walks it again; and
    cache vLLM's environment variables, which it otherwise reads from os.environ on every access
    (several per request: SamplingParams checks some)."""
    from vllm.envs import enable_envs_cache

    enable_envs_cache()
    gc.collect()
    gc.freeze()


def engine_environment(settings: Settings) -> None:
    """vLLM reads its settings from the environment: Choir's defaults, under what .env says."""
    from_settings = {key: value for key, value in settings.environ.items() if key.startswith("VLLM_")}
    # vLLM's renderer decodes chat's audio parts itself: the same bound as Choir's (a file with no length in its header)
    audio = {"VLLM_MAX_AUDIO_DECODE_DURATION_S": str(settings.max_audio_seconds)}
    for key, value in {**ENGINE_ENVIRONMENT, **audio, **from_settings}.items():
        os.environ.setdefault(key, value)


@asynccontextmanager
async def start_vllm_engine(settings: Settings, client: ClientConfig | None = None) -> AsyncIterator[Engine]:
    """The generation engine. `client`: attach to engine cores a supervisor started (choir/cli/serve.py), as API
    process i of N; None: start the engines here, in this process's AsyncLLM."""
    from choir.engine.vllm.engine import VllmEngine
    from choir.engine.vllm.grammar import GrammarGate

    async with _started(settings, settings.generation, client) as (engine, engine_args, version):
        grammars = GrammarGate(engine.vllm_config, settings.max_grammar_bytes, settings.grammar_compile_seconds,
                               settings.grammar_compilers)
        try:
            served = VllmEngine(engine, engine_args, version, settings.model)
            served.grammars = grammars
            served.render_chats_with(settings.chat_template, settings.chat_template_content_format)
            if engine_args.enable_log_requests:
                from vllm.entrypoints.serve.utils.request_logger import RequestLogger

                served.request_log = RequestLogger(max_log_len=settings.max_log_len)
            for module in settings.lora_modules:  # a bad adapter stops start-up, named (after the engine stops)
                try:
                    await served.load_adapter(module.name, module.path, base_model_name=module.base_model_name)
                except AdapterError as exc:
                    raise SettingsError(f"CHOIR_LORA_MODULES: {exc}") from None
            yield served
        finally:
            grammars.close()


@asynccontextmanager
async def start_vllm_pooling_engine(settings: Settings, model: RoleModel,
                                    client: ClientConfig | None = None) -> AsyncIterator[PoolingEngine]:
    """A pooling role's engine (embed, rerank, classify); `client` as for start_vllm_engine."""
    from choir.engine.vllm.pooling import VllmPoolingEngine

    async with _started(settings, model, client) as (engine, engine_args, version):
        yield await VllmPoolingEngine.create(engine, engine_args, version, model)


@asynccontextmanager
async def _started(settings: Settings, model: RoleModel,
                   client: ClientConfig | None) -> AsyncIterator[tuple[Any, Any, str]]:
    check_vllm_version(settings.environ)
    engine_environment(settings)
    import vllm
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    # The first engine checks that all of them fit on the GPU, before any starts; an attached worker's
    # supervisor checked once, before it started the cores (choir/cli/serve.py).
    if client is None and model.role == "generate" and not on_cpu:
        check_gpu_share(settings)
    engine_args = parse_role_args(settings, model, on_cpu)
    gc.unfreeze()  # a later engine's start-up: frozen again after it
    started = time.perf_counter()
    async with async_llm(engine_args, client, model.variables[2]) as engine:
        log.info("engine started", role=model.role, model=model.model,
                 seconds=round(time.perf_counter() - started, 1), **client_label(client))
        settle_after_startup()
        try:
            yield engine, engine_args, vllm.__version__
        finally:
            gc.unfreeze()  # collectable again, at shutdown at the latest
    log.info("engine stopped", role=model.role)


def start_vllm_role(settings: Settings, model: RoleModel,
                    client: ClientConfig | None = None) -> AbstractAsyncContextManager[Engine | PoolingEngine]:
    """The engine of any role: the engine plugin's default factory (choir/engine/roles.py)."""
    if model.role == "generate":
        return start_vllm_engine(settings, client)
    return start_vllm_pooling_engine(settings, model, client)
