"""A short text prompt's tokens straight from the Rust tokenizer, where that gives what vLLM's renderer would.

vLLM's renderer tokenizes a text prompt with `tokenizer(text, truncation=…, max_length=…, add_special_tokens=…)`.
For a transformers fast tokenizer that call ends in its `tokenizers` backend's `encode_batch([text])`, after some
35 µs of Python around it (argument checks, padding and truncation set-up, BatchEncoding; 61 µs for the call against
27 µs for the backend's `encode` on a ten-word prompt): more than the encoding itself. Handing the renderer the
token ids instead (with the text: vLLM's renderer does the same once it has tokenized) skips that wrapper; every
check the renderer makes on token ids (vocabulary, length, truncation) still runs.

Only where it gives the same ids: a tokenizer whose class keeps transformers' own `__call__` and `_encode_plus`
(vLLM's cached wrapper does, and so does the class under vLLM's thread pool; a model's own tokenizer class or
vLLM's Mistral tokenizer does not), on a request with no truncation (vLLM then asks for none), while the backend
holds no truncation or padding of its own and encodes special tokens as the tokenizer says to. Anything else is
vLLM's renderer's, as before. The backend is only read here (no setting changed), on the event loop's thread.
"""

from collections.abc import Callable
from typing import Any

Encoder = Callable[[str, bool], list[int] | None]


def direct_encoder(tokenizer: Any) -> Encoder | None:
    """`encode(text, add_special_tokens)`: the ids vLLM's renderer would give `text`, or None where this cannot
    promise that (the caller then asks the renderer). None for a tokenizer this never applies to."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers: its call path is not the one read here
        return None
    kind = type(tokenizer)
    if _pooled(kind):
        # vLLM's renderer calls a deep copy of the tokenizer, an instance of the class it had before the pool
        # (choir's encoder reads only this one's backend, and on the event loop's thread: as vLLM's detokenizer)
        kind = kind.__bases__[0]
    if not (isinstance(tokenizer, TokenizersBackend) and kind.__call__ is PreTrainedTokenizerBase.__call__
            and kind._encode_plus is TokenizersBackend._encode_plus):
        return None
    backend = getattr(tokenizer, "_tokenizer", None)
    split = getattr(tokenizer, "split_special_tokens", None)
    if backend is None or not isinstance(split, bool):
        return None
    encode = backend.encode

    def encoder(text: str, add_special_tokens: bool) -> list[int] | None:
        # transformers sets these on the shared backend per call (another request's truncation stays set until
        # the next call); while any is set, its own call is the one that resets them
        if backend.truncation is not None or backend.padding is not None or backend.encode_special_tokens != split:
            return None
        return encode(text, add_special_tokens=add_special_tokens).ids

    return encoder


def plain_text_tokens(params: Any) -> bool:
    """Whether vLLM's TokenizeParams tokenize a text prompt as it is: no truncation (nor the length check on text
    that comes with a bound), no lower-casing, no character offsets."""
    return (params.max_total_tokens is None and params.truncate_prompt_tokens is None and not params.do_lower_case
            and not params.return_token_offsets)


def text_prompt(text: str, encode: Encoder | None, add_special_tokens: bool) -> dict[str, Any]:
    """A text prompt as vLLM's renderer takes it: with its ids beside the text (as the renderer's own tokenizing
    leaves it) where `encode` gives them, else the text alone."""
    token_ids = encode(text, add_special_tokens) if encode is not None else None
    return {"prompt": text} if token_ids is None else {"prompt_token_ids": token_ids, "prompt": text}


def _pooled(kind: type) -> bool:
    """Whether `kind` is vLLM's TokenizerPool (vllm/tokenizers/hf.py), which the renderer puts around a fast
    tokenizer: its `__call__` and `encode` borrow a deep copy from a pool."""
    try:
        from vllm.tokenizers.hf import ThreadSafeHFTokenizerMixin
    except ImportError:
        return False
    return issubclass(kind, ThreadSafeHFTokenizerMixin) and kind.__bases__[1:] == (ThreadSafeHFTokenizerMixin,)
