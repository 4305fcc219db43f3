"""Wire types of the pooling endpoints beyond embeddings: /rerank (vLLM's, Jina's and Cohere's shape),
/score (vLLM's) and /classify (vLLM's)."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from choir.core.protocol.common import RequestId


class RerankDocument(msgspec.Struct, kw_only=True):
    """A document as an object (Cohere's v1 and vLLM's form); a plain string is the same as {"text": ...}."""

    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    query: str
    documents: str | list[str | RerankDocument]  # one string: one document (vLLM's)
    top_n: Annotated[int, Meta(ge=1)] | None = None  # the best n results; None: every document
    return_documents: bool = True  # each result's `document` (vLLM always returns it; Cohere's SDK may ask not to)
    max_tokens_per_doc: Annotated[int, Meta(ge=1)] | None = None  # Cohere's and vLLM's: each document cut to this
    use_activation: bool | None = None  # vLLM's: false gives the raw logit, not the sigmoid's relevance
    request_id: RequestId | None = None
    priority: int = 0  # vLLM's: served on generation only (a non-zero value is a 400 here)
    # vLLM's truncation of the pair and of the query: not served (a 400 unless at their defaults)
    truncate_prompt_tokens: int | None = None
    max_tokens_per_query: int = 0


class RerankUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class RerankResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int  # the document's position in `documents`
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(msgspec.Struct, kw_only=True):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]  # most relevant first


class ScoreRequest(msgspec.Struct, kw_only=True):
    """Pairs to score: one text_1 against each text_2, or text_1[i] against text_2[i]."""

    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    use_activation: bool | None = None
    request_id: RequestId | None = None
    priority: int = 0
    max_tokens_per_doc: Annotated[int, Meta(ge=1)] | None = None  # each text_2 cut to this many tokens
    truncate_prompt_tokens: int | None = None  # vLLM's: not served (a 400 unless null)
    max_tokens_per_query: int = 0  # vLLM's: not served (a 400 unless 0)


class PoolingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreData(msgspec.Struct, kw_only=True):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: PoolingUsage


class ClassificationRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    # A string, a list of strings, a list of token ids or a list of token-id lists (as completions' prompt).
    input: str | list[Any]
    use_activation: bool | None = None  # false: the logits, not the probabilities
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1)] | None = None
    add_special_tokens: bool = True
    request_id: RequestId | None = None
    priority: int = 0
    user: str | None = None


class ClassificationData(msgspec.Struct, kw_only=True):
    index: int
    label: str | None  # the most probable class's name (the model's id2label), if it has one
    probs: list[float]
    num_classes: int


class ClassificationResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: PoolingUsage
