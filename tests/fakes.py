"""A scripted, recording engine for route-level tests: what reaches the engine, and what comes back.

Tokens are characters (token id = code point + 3; 0..2 are bos/eos/pad), so prompts and
outputs are easy to predict. The generation fake takes Choir's `Sampling` through the real adapter
(choir/engine/vllm/sampling.py), so vLLM's checks refuse what they refuse and each `Call` records the
SamplingParams vLLM would get; its outputs are plain dataclasses of the seam's output types.
"""

import asyncio
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from choir.core.settings import RoleModel, Settings
from choir.engine.operator import PauseMode
from choir.engine.outputs import EngineOutput, FinishReason
from choir.engine.protocol import (
    CHAT_RENDER,
    COMPLETION_RENDER,
    NO_OPTIONS,
    ChatTemplateOptions,
    Engine,
    EngineRejected,
    GenerateOptions,
    PoolingEngine,
    Prompt,
    RenderOptions,
)
from choir.engine.roles import AnyEngine, EngineFactory
from choir.engine.sampling import Sampling
from choir.engine.vllm.parsers import VllmParsers
from choir.engine.vllm.sampling import SamplingAdapter

BOS = 0


def encode(text: str) -> list[int]:
    return [ord(ch) + 3 for ch in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i - 3) if i >= 3 else "" for i in ids)


@dataclass
class Call:
    prompt: Prompt
    params: Any  # the SamplingParams vLLM would get
    request_id: str
    options: GenerateOptions = NO_OPTIONS
    sampling: Sampling | None = None  # what the serving side sent


@dataclass(frozen=True, slots=True)
class Logprob:
    logprob: float
    rank: int | None
    decoded_token: str | None


@dataclass(slots=True)
class SampleOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None


@dataclass(slots=True)
class Output:
    """One engine step's output for a request (the seam's EngineOutput)."""

    request_id: str
    prompt_token_ids: list[int] | None
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[SampleOutput]
    finished: bool
    num_cached_tokens: int | None = None


@dataclass
class FakeOperator:
    """The operator calls (choir/engine/operator.py), recorded; whether the engine may sleep or profile is what a
    test says it was started with."""

    sleep_mode: bool = False
    profiler: bool = False
    paused: bool = False
    sleeping: bool = False
    prefix_cache_busy: bool = False  # blocks still held: a reset says False unless it resets running requests
    operations: list[tuple[str, Any]] = field(default_factory=list)

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_external: bool = False) -> bool:
        self.operations.append(("reset_prefix_cache", (reset_running_requests, reset_external)))
        return reset_running_requests or not self.prefix_cache_busy

    async def reset_mm_cache(self) -> None:
        self.operations.append(("reset_mm_cache", None))

    async def pause(self, mode: PauseMode = "abort", clear_cache: bool = True) -> None:
        self.operations.append(("pause", (mode, clear_cache)))
        self.paused = True

    async def resume(self) -> None:
        self.operations.append(("resume", None))
        self.paused = False

    async def is_paused(self) -> bool:
        return self.paused

    async def sleep(self, level: int = 1, mode: PauseMode = "abort") -> None:
        if not self.sleep_mode:
            raise EngineRejected("The engine was started without --enable-sleep-mode.")
        self.operations.append(("sleep", (level, mode)))
        self.sleeping = True

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        if not self.sleep_mode:
            raise EngineRejected("The engine was started without --enable-sleep-mode.")
        self.operations.append(("wake_up", tags))
        self.sleeping = tags is not None and "weights" not in tags
        return not self.sleeping

    async def is_sleeping(self) -> bool:
        return self.sleeping

    async def start_profile(self, prefix: str | None = None) -> None:
        if not self.profiler:
            raise EngineRejected("The engine was started without a profiler: start it with --profiler-config.")
        self.operations.append(("start_profile", prefix))

    async def stop_profile(self) -> None:
        if not self.profiler:
            raise EngineRejected("The engine was started without a profiler: start it with --profiler-config.")
        self.operations.append(("stop_profile", None))

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[str, ...] = (),
                             kwargs: dict[str, str] | None = None) -> list[Any]:
        self.operations.append(("collective_rpc", (method, timeout, args, kwargs)))
        return [{"method": method, "args": list(args)}, None, "worker 2"]

    async def server_info(self, as_json: bool = False) -> dict[str, Any]:
        config = {"model": "fake"} if as_json else "model=fake"
        return {"vllm_config": config, "vllm_env": {"VLLM_HOST_IP": "127.0.0.1"}, "system_env": {}}

    def kv_event_sources(self) -> dict[str, Any]:
        return {}


@dataclass
class FakeEngine(FakeOperator):
    """`script(prompt_text, params) -> list of text pieces` decides what each request generates."""

    script: Callable[[str, Any], list[str]] = lambda prompt, params: ["Hello", " world", "!"]
    served_model_names: tuple[str, ...] = ("fake-model",)
    model_root: str = "/models/fake"
    max_model_len: int = 64
    engine_name: str = "vllm"
    version: str = "fake"
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    priority_scheduling: bool = False
    data_parallel_size: int = 1
    vocab_size: int = 0x110000 + 3  # every code point
    max_images: int = 0
    max_audios: int = 0
    speech: Any = None  # a FakeSpeech (tests/test_audio.py): the model takes audio
    realtime: Any = None  # a FakeRealtime (tests/test_realtime.py): the model transcribes streamed audio
    tokenizer: Any = None  # a real tokenizer, for scripts whose token ids must mean something (parsers)
    cached_tokens: int | None = None  # what each output says of the prefix cache (None: nothing)
    is_alive: bool = True
    fail_with: BaseException | None = None
    delay: float = 0.0
    adapters: dict[str, str] = field(default_factory=dict)  # LoRA adapters: name → path
    calls: list[Call] = field(default_factory=list)
    renders: list[RenderOptions] = field(default_factory=list)  # each render's options
    templates: list[ChatTemplateOptions] = field(default_factory=list)
    conversations: list[list[dict[str, Any]]] = field(default_factory=list)  # each render_chat's messages
    aborted: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    _adapter: SamplingAdapter | None = field(default=None, repr=False)

    async def render_completion(self, prompts: list[str] | list[list[int]],
                                options: RenderOptions = COMPLETION_RENDER) -> list[Prompt]:
        self.renders.append(options)
        out = []
        for p in prompts:
            ids = ([BOS] if options.add_special_tokens else []) + encode(p) if isinstance(p, str) else list(p)
            ids = _truncated(ids, options)
            out.append(Prompt(token_ids=ids, text=p if isinstance(p, str) else self.detokenize(ids), engine_input=ids))
        return out

    async def render_chat(self, messages: list[dict[str, Any]], template: ChatTemplateOptions,
                          options: RenderOptions = CHAT_RENDER) -> Prompt:
        self.renders.append(options)
        self.templates.append(template)
        self.conversations.append(messages)
        text = "".join(f"<{m['role']}>{_text(m.get('content'))}" for m in messages)
        if template.add_generation_prompt:
            text += "<assistant>"
        # With a real tokenizer the prompt's ids are real too (parsers read markers in the prompt).
        ids = [BOS, *(self.tokenizer.encode(text, add_special_tokens=False) if self.tokenizer else encode(text))]
        return Prompt(token_ids=ids, text=text, engine_input=ids)

    def token_strings(self, token_ids: list[int]) -> list[str]:
        return ["<s>" if i == BOS else decode([i]) for i in token_ids]

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return decode(token_ids) if skip_special_tokens else "".join(
            "<s>" if i == BOS else decode([i]) for i in token_ids)

    def token_pieces(self, token_ids: list[int]) -> list[str]:
        return self.token_strings(token_ids)

    def parsers(self, reasoning: str | None, tool: str | None) -> VllmParsers:
        return VllmParsers.load(self.tokenizer, reasoning, tool)

    async def generate(self, prompt: Prompt, params: Sampling, request_id: str,
                       options: GenerateOptions = NO_OPTIONS) -> AsyncGenerator[EngineOutput, None]:
        sampling, adapter = params, self._adapter
        if adapter is None or adapter.defaults is not self.default_sampling_params:  # a test may set new ones
            adapter = self._adapter = SamplingAdapter(self.default_sampling_params)
        vllm_params = adapter(sampling)  # EngineRejected as from VllmEngine.generate
        self.calls.append(Call(prompt, vllm_params, request_id, options, sampling))
        if self.fail_with is not None:
            raise self.fail_with
        text = prompt.text if prompt.text is not None else decode(prompt.token_ids)
        pieces = self.script(text, vllm_params)[: vllm_params.max_tokens]
        delta = sampling.stream
        # logprobs per position: the top `logprobs`, or the listed `logprob_token_ids` (here: as many)
        wanted = vllm_params.logprobs if vllm_params.logprobs is not None else (
            len(vllm_params.logprob_token_ids) if vllm_params.logprob_token_ids else None)
        self.running.add(request_id)
        try:
            text = ""
            ids: list[int] = []
            logprobs: list[dict[int, Logprob]] | None = []
            for i, piece in enumerate(pieces):
                if self.delay:
                    await asyncio.sleep(self.delay)
                last = i == len(pieces) - 1
                finish: FinishReason | None = None
                if last:
                    finish = "length" if len(pieces) == vllm_params.max_tokens else "stop"
                piece_ids = self.tokenizer.encode(piece, add_special_tokens=False) if self.tokenizer else encode(piece)
                piece_lps = [_logprobs(t, wanted) for t in piece_ids] if wanted is not None else None
                if delta:
                    text, ids, logprobs = piece, piece_ids, piece_lps
                else:
                    text, ids = text + piece, ids + piece_ids
                    logprobs = (logprobs + piece_lps) if piece_lps is not None and logprobs is not None else None
                if delta or last:
                    prompt_lps = None
                    if vllm_params.prompt_logprobs is not None and (i == 0 or not delta):
                        prompt_lps = [None, *(_logprobs(t, vllm_params.prompt_logprobs) for t in prompt.token_ids[1:])]
                    # each token's logprob is -0.5 (see _logprobs); whole outputs say their sum
                    cumulative = -0.5 * len(ids) if wanted is not None and not delta else None
                    output = SampleOutput(index=0, text=text, token_ids=list(ids), cumulative_logprob=cumulative,
                                          logprobs=logprobs, finish_reason=finish)
                    yield Output(request_id=request_id, prompt_token_ids=prompt.token_ids, prompt_logprobs=prompt_lps,
                                 outputs=[output], finished=last, num_cached_tokens=self.cached_tokens)
        except (asyncio.CancelledError, GeneratorExit):  # as vLLM's generate: leaving early aborts
            self.aborted.append(request_id)
            raise
        finally:
            self.running.discard(request_id)

    def adapter_parent(self, name: str) -> str:
        return self.served_model_names[0]

    async def load_adapter(self, name: str, path: str, load_inplace: bool = False, is_3d_lora_weight: bool = False,
                           base_model_name: str | None = None) -> None:
        from choir.engine.protocol import AdapterError

        if name in self.served_model_names or (name in self.adapters and not load_inplace):
            raise AdapterError(f"The model name `{name}` is taken.", "name")
        if not path.startswith("/adapters/"):
            raise AdapterError(f"No adapter found at {path}.")
        self.adapters[name] = path

    async def unload_adapter(self, name: str) -> None:
        from choir.engine.protocol import UnknownAdapter

        if self.adapters.pop(name, None) is None:
            raise UnknownAdapter(name)

    async def abort_all(self) -> int:
        self.aborted.extend(self.running)
        return len(self.running)

    def num_unfinished_requests(self) -> int:
        return len(self.running)


@dataclass
class FakePoolingEngine(FakeOperator):
    """A pooling role's engine. Embeds a prompt as its token ids' histogram over `embedding_size` buckets
    (deterministic, and different prompts get different vectors); classifies it by the same histogram over
    its labels, softmaxed (one label: the sigmoid of its share of even token ids); a pair is the two
    prompts' ids with a 0 between. Records every request."""

    served_model_names: tuple[str, ...] = ("fake-embed",)
    role: str = "embed"
    labels: tuple[str | None, ...] = ()
    model_root: str = "/models/fake-embed"
    max_model_len: int = 64
    embedding_size: int = 8
    matryoshka_dimensions: tuple[int, ...] | None = (4, 8)
    is_alive: bool = True
    embedded: list[tuple[Prompt, str, int | None, bool | None]] = field(default_factory=list)
    classified: list[tuple[Prompt, str]] = field(default_factory=list)

    vocab_size: int = FakeEngine.vocab_size
    max_images: int = 0
    max_audios: int = 0

    async def render_completion(self, prompts: list[str] | list[list[int]],
                                options: RenderOptions = COMPLETION_RENDER) -> list[Prompt]:
        return await FakeEngine.render_completion(FakeEngine(), prompts, options)

    async def render_chat(self, messages: list[dict[str, Any]], template: ChatTemplateOptions,
                          options: RenderOptions = CHAT_RENDER) -> Prompt:
        return await FakeEngine.render_chat(FakeEngine(), messages, template, options)

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return FakeEngine().detokenize(token_ids, skip_special_tokens)

    def token_pieces(self, token_ids: list[int]) -> list[str]:
        return FakeEngine().token_pieces(token_ids)

    async def embed(self, prompt: Prompt, request_id: str, dimensions: int | None = None,
                    normalize: bool | None = None) -> list[float]:
        self.embedded.append((prompt, request_id, dimensions, normalize))
        vector = [0.0] * self.embedding_size
        for token in prompt.token_ids:
            vector[token % self.embedding_size] += 1.0
        vector = vector[: dimensions or self.embedding_size]
        if normalize is not False:
            norm = sum(v * v for v in vector) ** 0.5 or 1.0
            vector = [v / norm for v in vector]
        return vector

    async def classify(self, prompt: Prompt, request_id: str, activation: bool | None = None) -> list[float]:
        self.classified.append((prompt, request_id))
        if len(self.labels) == 1:
            even = sum(1 for token in prompt.token_ids if token % 2 == 0) / max(len(prompt.token_ids), 1)
            logit = 4.0 * even - 2.0
            return [logit if activation is False else 1.0 / (1.0 + math.exp(-logit))]
        counts = [0.0] * len(self.labels)
        for token in prompt.token_ids:
            counts[token % len(self.labels)] += 1.0
        if activation is False:
            return counts
        exps = [math.exp(c - max(counts)) for c in counts]
        return [e / sum(exps) for e in exps]

    async def render_pair(self, first: str, second: str, max_second_tokens: int | None = None) -> Prompt:
        ids = [*encode(first), 0, *encode(second)[:max_second_tokens]]
        return Prompt(token_ids=ids, text=None, engine_input={"prompt_token_ids": ids})

    async def abort_all(self) -> int:
        return 0

    def num_unfinished_requests(self) -> int:
        return 0



def _truncated(ids: list[int], options: RenderOptions) -> list[int]:
    keep = options.truncate_prompt_tokens
    if keep is None or keep >= len(ids):
        return ids
    return ids[-keep:] if options.truncation_side == "left" else ids[:keep]


def _logprobs(token_id: int, k: int) -> dict[int, Logprob]:
    entries = {token_id: Logprob(logprob=-0.5, rank=1, decoded_token=decode([token_id]))}
    for j in range(1, k):
        entries[3 + j] = Logprob(logprob=-1.0 - j, rank=j + 1, decoded_token=decode([3 + j]))
    return entries


def _text(content: Any) -> str:
    """A message's text; an image is `<image>` (a VLM's template writes its placeholder)."""
    if isinstance(content, list):
        return "".join("<image>" if part.get("type") == "image_url" else part.get("text", "") for part in content)
    return content or ""


def fake_engine_factory(engine: AnyEngine) -> EngineFactory:
    """Starts `engine` for a role, as choir/engine/roles.py's factories start vLLM's."""

    @asynccontextmanager
    async def factory(settings: Settings, model: RoleModel | None = None) -> AsyncIterator[AnyEngine]:
        yield engine

    return factory


def _conforms(engine: "FakeEngine", pooling: "FakePoolingEngine") -> tuple[Engine, PoolingEngine]:
    """The fakes are engines of the seam's protocols: mypy checks them here (as the vLLM adapter's are checked
    where choir/engine/vllm/start.py yields them)."""
    return engine, pooling
