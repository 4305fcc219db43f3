"""/v1/embeddings wire types: OpenAI's, plus vLLM's tokenization extras."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from choir.core.protocol.common import RequestId


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    # A string, a list of strings, a list of token ids or a list of token-id lists (as completions' prompt).
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"  # base64: the bytes of `embed_dtype` values
    dimensions: Annotated[int, Meta(ge=1)] | None = None  # Matryoshka models: the first `dimensions` values
    user: str | None = None
    # vLLM's extras
    use_activation: bool | None = None  # false: the pooled vector as is, not normalized
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool = True
    request_id: RequestId | None = None
    # base64's values (float32 is what the OpenAI SDK decodes) and their byte order
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    priority: int = 0  # vLLM's: served on generation only (a non-zero value is a 400 here)
    padding: Literal["max_length", "do_not_pad"] | None = None  # vLLM's: not served (a 400 unless null)


class Embedding(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
    index: int


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
