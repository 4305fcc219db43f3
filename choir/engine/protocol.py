"""What Choir needs from an engine: the seam between the HTTP layer and vLLM.

`VllmEngine` implements it over vLLM's `AsyncLLM`; tests implement it with scripted fakes. The seam
speaks Choir's types: a request's `Sampling` (sampling.py), its outputs (outputs.py: structural types
vLLM's own outputs have, so they pass as they are) and the parsers (parsing.py); the vLLM adapter
(vllm_*.py) alone translates to and from vLLM's.
"""

from collections.abc import AsyncGenerator
from typing import Any, Literal, Protocol

import msgspec

from choir.core.errors import AdapterError, EngineDead, EngineRejected, UnknownAdapter
from choir.engine.operator import Operator
from choir.engine.outputs import EngineOutput
from choir.engine.parsing import Parsers
from choir.engine.prompt import Prompt
from choir.engine.sampling import Sampling
from choir.engine.speech import Realtime, Speech


class ImagesRejected(EngineRejected):
    """The engine's image loading or multimodal processing refused a prompt's images (naming none)."""


class ChatTemplateOptions(msgspec.Struct, frozen=True):
    """How messages are rendered (vLLM's ChatParams): the template's options, and for a request with images the
    per-request kwargs of vLLM's media loading and multimodal processor."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: dict[str, Any] = {}
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class RenderOptions(msgspec.Struct, frozen=True):
    """How one request's prompts are tokenized (vLLM's TokenizeParams and prompt extras)."""

    add_special_tokens: bool = True  # completions' default; a chat template writes its own
    detokenize: bool = False  # keep the prompt's text (echo)
    truncate_prompt_tokens: int | None = None  # keep this many tokens
    truncation_side: Literal["left", "right"] | None = None  # cut from here (None: the tokenizer's side)
    cache_salt: str | None = None  # salts the prefix cache's keys
    # Not generated from (/tokenize): the engine's multimodal processor cache is left alone, so that it never
    # takes the engine to hold images that were never sent to it (vLLM's /tokenize renders so too)
    skip_mm_cache: bool = False


class GenerateOptions(msgspec.Struct, frozen=True):
    """What one engine request carries besides its prompt and sampling params."""

    adapter: str | None = None  # the LoRA adapter (its model name) to generate with
    priority: int = 0  # lower runs earlier, under --scheduling-policy priority
    session_id: str | None = None
    # Structured outputs after reasoning (vLLM's server sends the same): True constrains from the
    # first token; None lets the engine find the end of the reasoning itself.
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    data_parallel_rank: int | None = None  # the engine rank to run on (None: vLLM's balancer chooses)


NO_OPTIONS = GenerateOptions()
RUNTIME_LORA_STATE_KEY = "runtime_lora"  # app state: whether adapters may be loaded at run time
COMPLETION_RENDER = RenderOptions()
CHAT_RENDER = RenderOptions(add_special_tokens=False)


# The seam's errors are core's (plain exceptions the HTTP side maps to answers).
__all__ = ["AdapterError", "EngineDead", "EngineRejected", "Prompt", "UnknownAdapter"]


class Tokenizing(Protocol):
    """What /tokenize and /detokenize use of an engine: every engine has it, pooling ones too."""

    served_model_names: tuple[str, ...]
    max_model_len: int
    vocab_size: int  # token ids go from 0 to vocab_size - 1
    max_images: int  # images one prompt may hold (vLLM's --limit-mm-per-prompt); 0: the model reads text only
    max_audios: int  # audio parts one prompt may hold, the same; 0: the model hears nothing

    async def render_completion(self, prompts: list[str] | list[list[int]],
                                options: RenderOptions = COMPLETION_RENDER) -> list[Prompt]: ...

    async def render_chat(self, messages: list[dict[str, Any]], template: ChatTemplateOptions,
                          options: RenderOptions = CHAT_RENDER) -> Prompt: ...

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def token_pieces(self, token_ids: list[int]) -> list[str]: ...


class Engine(Tokenizing, Operator, Protocol):
    model_root: str
    engine_name: str  # the engine's name and `version` its release, as the system fingerprint says them
    version: str
    default_sampling_params: dict[str, Any]  # from the model's generation_config: what `Sampling`'s Nones mean
    priority_scheduling: bool  # --scheduling-policy priority: `priority` orders requests
    data_parallel_size: int  # engine ranks this process can send a request to (1 without data parallelism)
    speech: Speech | None  # a speech-to-text model's side (choir/engine/speech.py); None for a text model
    realtime: Realtime | None  # a streaming speech model's side (/v1/realtime); None for any other

    @property
    def is_alive(self) -> bool: ...

    def generate(self, prompt: Prompt, params: Sampling, request_id: str,
                 options: GenerateOptions = NO_OPTIONS) -> AsyncGenerator[EngineOutput, None]:
        """The request's outputs (`params.stream`: one per engine step, else the final one); closing the
        generator aborts the request. EngineRejected when the engine refuses `params`."""
        ...

    def parsers(self, reasoning: str | None, tool: str | None) -> Parsers:
        """The reasoning and tool parsers of these names (CHOIR_REASONING_PARSER, CHOIR_TOOL_PARSER), built
        with the engine's tokenizer."""
        ...

    @property
    def adapters(self) -> dict[str, str]:
        """The loaded LoRA adapters: model name → path. Each is a model name of its own."""
        ...

    def adapter_parent(self, name: str) -> str:
        """The served name an adapter is based on (its `parent`): vLLM's base_model_name, else the first."""
        ...

    async def load_adapter(self, name: str, path: str, load_inplace: bool = False, is_3d_lora_weight: bool = False,
                           base_model_name: str | None = None) -> None: ...  # AdapterError

    async def unload_adapter(self, name: str) -> None: ...  # UnknownAdapter

    def token_strings(self, token_ids: list[int]) -> list[str]: ...

    async def abort_all(self) -> int: ...

    def num_unfinished_requests(self) -> int: ...


class PoolingEngine(Tokenizing, Operator, Protocol):
    """A pooling role's engine (embed, rerank, classify: choir/engine/roles.py)."""

    role: str
    model_root: str
    embedding_size: int  # embed: a vector's values
    matryoshka_dimensions: tuple[int, ...] | None  # () : any size up to embedding_size; None: only that
    labels: tuple[str | None, ...]  # rerank, classify: each label's name (its index is its class); () for embed

    @property
    def is_alive(self) -> bool: ...

    async def embed(self, prompt: Prompt, request_id: str, dimensions: int | None = None,
                    normalize: bool | None = None) -> list[float]: ...

    async def classify(self, prompt: Prompt, request_id: str, activation: bool | None = None) -> list[float]: ...

    async def render_pair(self, first: str, second: str, max_second_tokens: int | None = None) -> Prompt:
        """A query and a document as one prompt for a cross-encoder (the document cut to max_second_tokens)."""
        ...

    async def abort_all(self) -> int: ...

    def num_unfinished_requests(self) -> int: ...
