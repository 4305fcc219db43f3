"""POST /v1/embeddings: inputs → the embedding engine (one engine request each, concurrently) → vectors,
as floats or as base64 of their bytes: float32 (what the OpenAI SDK asks for by default), float16 or
bfloat16 (vLLM's `embed_dtype`), in the byte order `endianness` asks for."""

import base64
import struct
import sys

from choir.app.serving.models import pooling_model
from choir.app.serving.pooling import check_fits, run_all, usage_tokens
from choir.app.serving.prompts import completion_prompts
from choir.app.serving.unserved import EMBEDDING_UNSERVED, refuse_unserved
from choir.core.errors import bad_request
from choir.core.protocol.embeddings import Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage
from choir.engine.protocol import PoolingEngine, Prompt, RenderOptions
from choir.plugins.pipeline import Pipeline


async def plan_embeddings(pipeline: Pipeline, request: EmbeddingRequest) -> tuple[str, list[Prompt]]:
    """The model to report and the rendered inputs, checked before any reaches the engine."""
    model, engine = pooling_model(pipeline, "embed", request.model)
    if request.embed_dtype not in _PACKED:
        raise bad_request(f"embed_dtype {request.embed_dtype} is not served: send float32, float16 or bfloat16.",
                          "embed_dtype")
    refuse_unserved(request, EMBEDDING_UNSERVED)
    inputs = completion_prompts(request.input, "input")
    pipeline.fan_out.check_prompts(len(inputs), 1, "input")
    _check_dimensions(engine, model, request.dimensions)
    if request.truncation_side is not None and request.truncate_prompt_tokens is None:
        raise bad_request("truncation_side needs truncate_prompt_tokens: the number of input tokens to keep.",
                          "truncation_side")
    keep = engine.max_model_len if request.truncate_prompt_tokens == -1 else request.truncate_prompt_tokens
    prompts = await engine.render_completion(inputs, RenderOptions(
        add_special_tokens=request.add_special_tokens, truncate_prompt_tokens=keep,
        truncation_side=request.truncation_side))
    for index, prompt in enumerate(prompts):
        check_fits(engine, prompt, "input" if len(prompts) == 1 else f"input[{index}]",
                   "Shorten it, or set truncate_prompt_tokens.")
    return model, prompts


def _check_dimensions(engine: PoolingEngine, model: str, dimensions: int | None) -> None:
    if dimensions is None:
        return
    sizes = engine.matryoshka_dimensions
    if sizes is None:
        raise bad_request(f"`{model}` does not support `dimensions`: its embeddings have {engine.embedding_size} "
                          "values, which cannot be cut shorter. Leave dimensions out.", "dimensions")
    if dimensions > engine.embedding_size or (sizes and dimensions not in sizes):
        allowed = ", ".join(map(str, sizes)) if sizes else f"1 to {engine.embedding_size}"
        raise bad_request(f"`{model}` gives embeddings of {allowed} dimensions, not {dimensions}.", "dimensions")


async def embed(pipeline: Pipeline, request: EmbeddingRequest, model: str, prompts: list[Prompt],
                response_id: str) -> EmbeddingResponse:
    engine = pipeline.engines.pooling("embed")
    assert engine is not None  # plan_embeddings found it

    async def one(prompt: Prompt, request_id: str) -> list[float]:
        return await engine.embed(prompt, request_id, request.dimensions, request.use_activation)

    vectors = await run_all(prompts, response_id, one)
    data = [Embedding(embedding=_encoded(vector, request), index=i) for i, vector in enumerate(vectors)]
    tokens = usage_tokens(prompts)
    return EmbeddingResponse(data=data, model=model, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))


_PACKED = {"float32": "f", "float16": "e", "bfloat16": "H"}  # struct's codes (bfloat16: as its 16 bits)
_BYTE_ORDER = {"little": "<", "big": ">", "native": "<" if sys.byteorder == "little" else ">"}


def _encoded(vector: list[float], request: EmbeddingRequest) -> list[float] | str:
    if request.encoding_format == "float":
        return vector
    values = list(map(_bfloat16_bits, vector)) if request.embed_dtype == "bfloat16" else vector
    packed = struct.pack(f"{_BYTE_ORDER[request.endianness]}{len(values)}{_PACKED[request.embed_dtype]}", *values)
    return base64.b64encode(packed).decode("ascii")


def _bfloat16_bits(value: float) -> int:
    """The upper half of the float32's bits, rounded to nearest even (as torch converts)."""
    [bits] = struct.unpack("<I", struct.pack("<f", value))
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
