"""`Engine` over vLLM's `AsyncLLM` (choir/engine/vllm/start.py starts it). Imported only inside the lifespan:
vLLM pulls in torch (seconds)."""

import asyncio
import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from choir.engine.outputs import EngineOutput
from choir.engine.protocol import (
    NO_OPTIONS,
    AdapterError,
    EngineDead,
    EngineRejected,
    GenerateOptions,
    Prompt,
    UnknownAdapter,
)
from choir.engine.sampling import Sampling
from choir.engine.speech import Realtime, Speech
from choir.engine.vllm.base import VllmBase
from choir.engine.vllm.errors import reraise
from choir.engine.vllm.grammar import GrammarGate
from choir.engine.vllm.parsers import VllmParsers
from choir.engine.vllm.realtime import VllmRealtime
from choir.engine.vllm.sampling import SamplingAdapter
from choir.engine.vllm.speech import VllmSpeech


class VllmEngine(VllmBase):
    """The generation engine, with its LoRA adapters (each a model name of its own)."""

    def __init__(self, engine: Any, engine_args: Any, version: str, model: str | None = None) -> None:
        from vllm.lora.request import LoRARequest

        super().__init__(engine, engine_args, version, model)
        self._lora_request = LoRARequest
        config = engine.model_config
        self.engine_name = "vllm"
        self.default_sampling_params = dict(config.get_diff_sampling_param())
        self._sampling = SamplingAdapter(self.default_sampling_params)  # Choir's Sampling → vLLM's SamplingParams
        self.priority_scheduling = engine.vllm_config.scheduler_config.policy == "priority"
        parallel = engine.vllm_config.parallel_config
        # The ranks vLLM's InputProcessor accepts from this client (a hybrid-LB node: its own).
        self.data_parallel_size = parallel.data_parallel_size_local if parallel.local_engines_only \
            else parallel.data_parallel_size
        self._loras: dict[str, Any] = {}  # adapter name → vLLM's LoRARequest
        self._next_lora_id = 1
        self._adapters_lock = asyncio.Lock()
        self.grammars: GrammarGate | None = None  # set by start_vllm_engine
        # --enable-log-requests (an engine flag): each request logged by vLLM's own RequestLogger, as its server does
        self.request_log: Any = None
        self.speech: Speech | None = VllmSpeech.of(engine)  # a speech-to-text model (Whisper, ...): /v1/audio/*
        self.realtime: Realtime | None = VllmRealtime.of(engine)  # a streaming one (Qwen3-ASR, ...): /v1/realtime

    async def generate(self, prompt: Prompt, params: Sampling, request_id: str,
                       options: GenerateOptions = NO_OPTIONS) -> AsyncGenerator[EngineOutput, None]:
        """vLLM's RequestOutputs are the seam's EngineOutputs as they are."""
        from vllm.v1.engine.exceptions import EngineDeadError

        sampling_params = self._sampling(params)  # EngineRejected: vLLM's checks refused a value
        if self.request_log is not None:
            self.request_log.log_inputs(request_id, prompt.text, prompt.token_ids, None, sampling_params,
                                        self._loras.get(options.adapter) if options.adapter else None)
        structured = sampling_params.structured_outputs
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
        engine_input = prompt.engine_input
        try:
            while True:
                lost = False
                # aclosing: when our caller closes us, vLLM's generator must see it now (and abort).
                async with aclosing(self._engine.generate(engine_input, sampling_params, request_id,
                                                          **extra)) as outputs:
                    async for output in outputs:
                        if prompt.rerender is not None and engine_input is prompt.engine_input \
                                and _images_lost(output):
                            lost = True
                            break
                        yield output
                if not lost:
                    return
                # vLLM's processor cache took the engine to hold this prompt's images, and it did not (they were
                # rendered for a request never sent: a refused one, a count): the engine asks for them again, with
                # their data, which a client of vLLM's own server must do itself (a 500 there). Once.
                engine_input = await prompt.rerender()
        except EngineDeadError as exc:
            raise EngineDead(str(exc)) from exc
        except Exception as exc:
            reraise(exc)

    def parsers(self, reasoning: str | None, tool: str | None) -> VllmParsers:
        return VllmParsers.load(self.tokenizer, reasoning, tool)

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


def _images_lost(output: Any) -> bool:
    """vLLM's answer to a prompt whose images its engine's cache lacks: finished with `error`, nothing generated."""
    if not output.finished or not output.outputs:
        return False
    completion = output.outputs[0]
    return completion.finish_reason == "error" and not completion.token_ids


def _worker_reason(exc: Exception) -> str:
    text = str(exc)
    quoted = re.search(r"Worker failed with error '(.+?)'", text)
    return (quoted.group(1) if quoted else text.split("\n")[0]).rstrip(".") + "."
