"""A short text prompt tokenized straight by the Rust tokenizer (choir/engine/vllm/text_tokens.py): the very ids
vLLM's renderer gets from its own tokenizer call, or no answer (the renderer then tokenizes, as before)."""

import copy
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choir.core.settings import BUNDLED_MODEL_DIR
from choir.engine.vllm.text_tokens import direct_encoder, plain_text_tokens, text_prompt

TEXTS = ["", " ", "hello there", "  two  spaces ", "<s>Hello</s> <pad> x", "<|user|>\nhi</s>\n<|assistant|>\n",
         "ünïcödé ✓ 漢字 🙂", "tabs\tand\nnewlines\r\n", "a" * 5000, "<s><s></s>"]


@cache
def vllm_tokenizer():
    """The bundled model's tokenizer as vLLM's renderer holds it: its cached subclass, in a pool of copies
    (vllm/renderers/hf.py)."""
    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import get_cached_tokenizer, maybe_make_thread_pool

    tokenizer = get_cached_tokenizer(AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_DIR)))
    maybe_make_thread_pool(tokenizer, 2)
    return tokenizer


def renderer_ids(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """What vLLM's renderer asks the tokenizer for a text prompt with no truncation."""
    from vllm.renderers.params import TokenizeParams

    kwargs = TokenizeParams(max_total_tokens=None, add_special_tokens=add_special_tokens).get_encode_kwargs()
    return list(tokenizer(text, **kwargs)["input_ids"])


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_the_ids_are_the_renderers(text, add_special_tokens):
    tokenizer = vllm_tokenizer()
    assert type(tokenizer).__name__.startswith("TokenizerPool")
    encode = direct_encoder(tokenizer)
    assert encode is not None
    assert encode(text, add_special_tokens) == renderer_ids(tokenizer, text, add_special_tokens)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), add_special_tokens=st.booleans())
def test_any_text_gets_the_renderers_ids(text, add_special_tokens):
    tokenizer = vllm_tokenizer()
    encode = direct_encoder(tokenizer)
    assert encode is not None
    assert encode(text, add_special_tokens) == renderer_ids(tokenizer, text, add_special_tokens)


def test_while_the_backend_truncates_the_renderer_tokenizes():
    """transformers leaves a truncating call's settings on the shared Rust tokenizer until its next call: the
    encoder gives no answer meanwhile, rather than a truncated one."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_DIR))
    encode = direct_encoder(tokenizer)
    assert encode is not None
    text = "one two three four five six seven eight"
    whole = encode(text, True)
    assert whole is not None and len(whole) > 4
    assert len(tokenizer(text, truncation=True, max_length=3)["input_ids"]) == 3
    assert encode(text, True) is None
    tokenizer(text, truncation=False, max_length=None)  # transformers' own call resets it
    assert encode(text, True) == whole


def test_split_special_tokens_is_the_tokenizers_say():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_DIR), split_special_tokens=True)
    encode = direct_encoder(tokenizer)
    assert encode is not None
    text = "<s>hi</s>"
    expected = renderer_ids(tokenizer, text, False)  # transformers sets the backend's flag on its call
    assert encode(text, False) == expected
    assert tokenizer.convert_tokens_to_ids("<s>") not in expected


def test_a_tokenizer_of_its_own_is_left_to_the_renderer():
    """A class that changes how text is encoded (a model's own tokenizer, vLLM's Mistral one) or no transformers
    tokenizer at all: no direct encoder."""
    from transformers import AutoTokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    from vllm.tokenizers.hf import maybe_make_thread_pool

    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_DIR))

    class OwnEncoding(type(tokenizer)):  # type: ignore[misc]
        def _encode_plus(self, *args, **kwargs):
            return TokenizersBackend._encode_plus(self, *args, **kwargs)

    class OwnCall(type(tokenizer)):  # type: ignore[misc]
        def __call__(self, *args, **kwargs):
            return super().__call__(*args, **kwargs)

    for kind in (OwnEncoding, OwnCall):
        tokenizer.__class__ = kind
        assert direct_encoder(tokenizer) is None
        pooled = copy.copy(tokenizer)
        maybe_make_thread_pool(pooled)  # vLLM's pool around it: the class under the pool decides
        assert type(pooled).__name__.startswith("TokenizerPool") and direct_encoder(pooled) is None
    assert direct_encoder(object()) is None


def test_only_untruncated_prompts_are_tokenized_here():
    """What vLLM's renderer tokenizes as it is: Choir's own parameters (no length bound: Choir checks lengths) and
    none that truncates, lower-cases or asks for offsets."""
    from vllm.renderers.params import TokenizeParams

    assert plain_text_tokens(TokenizeParams(max_total_tokens=None, add_special_tokens=False))
    for changed in ({"max_total_tokens": 64}, {"truncate_prompt_tokens": 8}, {"do_lower_case": True},
                    {"return_token_offsets": True}):
        assert not plain_text_tokens(TokenizeParams(**{"max_total_tokens": None, **changed}))


def test_a_text_prompt_carries_its_ids_only_when_the_encoder_gives_them():
    assert text_prompt("hi", lambda text, special: [1, 2] if special else [2], True) == {
        "prompt_token_ids": [1, 2], "prompt": "hi"}
    assert text_prompt("hi", lambda text, special: None, True) == {"prompt": "hi"}
    assert text_prompt("hi", None, True) == {"prompt": "hi"}
