"""/v1/embeddings wire types: OpenAI's, plus vLLM's tokenization extras."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    # A string, a list of strings, a list of token ids or a list of token-id lists (as completions' prompt).
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"  # base64: little-endian float32 bytes
    dimensions: Annotated[int, Meta(ge=1)] | None = None  # Matryoshka models: the first `dimensions` values
    user: str | None = None
    # vLLM's extras
    use_activation: bool | None = None  # false: the pooled vector as is, not normalized
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool = True
    request_id: Annotated[str, Meta(min_length=1)] | None = None


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
