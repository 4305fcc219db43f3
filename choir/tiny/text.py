"""Build a tiny, deterministic, random-weight Llama model directory for tests.

The directory (byte-level BPE tokenizer with a chat template, safetensors
weights) is created offline and loads in vLLM like any Hugging Face model. Its
output is gibberish by design, but always printable ASCII, and it never samples
eos or other special tokens on its own, so generations run to max_tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from choir.core.settings import BUNDLED_MARKER as MARKER

# Any edit to this file changes the version, so existing directories get rebuilt.
BUILDER_VERSION = "choir-tiny-" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
# Where `choir-tiny-models` builds it: models/ in the directory it runs from (a checkout's, by `make install`).
DEFAULT_DIR = Path("models") / "choir-tiny"

VOCAB_SIZE = 768
PAD, BOS, EOS = "<pad>", "<s>", "</s>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, *ROLE_TOKENS]  # ids 0, 1, 2, ...
# Reasoning and tool-call markers (deepseek_r1/qwen3 and hermes style), one token each and kept in
# the decoded text, so vLLM's parsers work with this model. The weights never emit them by themselves.
MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set content = message['content'] %}"
    "{% elif message['content'] is none %}{% set content = '' %}"
    "{% else %}{% set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + content + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}"
    # As DeepSeek-R1's and Qwen3-Thinking's templates: thinking asked for opens in the prompt (vLLM's thinking
    # budget counts from it; the random weights never write <think> themselves)
    "{% if enable_thinking is defined and enable_thinking %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model answers every question
with a few words, and the words are chosen at random. Tests do not need good answers;
they need answers that arrive quickly, in the right shape, and the same way every time.
Hello! How are you today? I am fine, thank you. What is the weather like in the city?
It is sunny and warm, with a light wind from the west and a few clouds over the hills.
The server streams tokens to the client as soon as they are ready. Each chunk carries
a piece of text, an index, and sometimes a reason why the generation has finished.
Numbers such as 0, 1, 2, 3, 42, 100 and 2048 appear in prompts, and so do symbols like
{ } [ ] ( ) < > : ; , . ! ? " ' - _ / \\ = + * & % $ # @ and the newline character.
Once upon a time there was a choir that sang in many voices at once. Every singer
listened to the others, and together they made one song out of many small parts.
"""


def _corpus() -> list[str]:
    lines = [line for line in _CORPUS.splitlines() if line.strip()]
    # Vary case and joining so merges cover capitalised words and word boundaries.
    variants = [*lines, *(line.lower() for line in lines), *(line.upper() for line in lines)]
    variants += [" ".join(lines[i : i + 3]) for i in range(len(lines))]
    return variants * 20


def train_bpe(vocab_size: int, special_tokens: list[str] | None = None) -> Any:
    """A byte-level BPE trained on the corpus, `special_tokens` first (ids 0, 1, ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=special_tokens or [],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def extend_tokenizer(out: Path, base: Path, tokens: list[str], chat_template: str, **config: Any) -> Any:
    """The tiny model's tokenizer at `base`, written to `out` with `tokens` added as special tokens (the last
    ids), `chat_template` and `config` in its tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in tokens])
    tok.save(str(out / "tokenizer.json"))
    written = json.loads((base / "tokenizer_config.json").read_text(encoding="utf-8"))
    written.update(chat_template=chat_template, **config)
    _write_json(out / "tokenizer_config.json", written)
    shutil.copyfile(base / "special_tokens_map.json", out / "special_tokens_map.json")
    return tok


def _build_tokenizer(out: Path) -> Any:
    from tokenizers import AddedToken, processors

    tok = train_bpe(VOCAB_SIZE, SPECIAL_TOKENS)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    # Plain encodes (completions, add_special_tokens=True) get a bos; the chat
    # template adds its own bos and vLLM encodes chat prompts without specials.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD})
    return tok


def _is_plain_text(piece: str) -> bool:
    # Special tokens decode to "", lone UTF-8 continuation bytes to "\ufffd".
    return bool(piece) and piece.isascii() and all(c.isprintable() or c in "\n\t" for c in piece)


def _build_weights(out: Path, tok: Any) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    ids = {name: tok.token_to_id(t) for name, t in (("bos", BOS), ("eos", EOS), ("pad", PAD))}
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        initializer_range=0.1,  # the default 0.02 gives near-uniform, prompt-independent logits
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    markup = {tok.token_to_id(t) for t in MARKUP_TOKENS}
    banned = [i for i in range(config.vocab_size) if i in markup or not _is_plain_text(tok.decode([i]))]
    with torch.no_grad():
        # Residual channel 0 is held at 1 (no layer reads or writes it), so the
        # final hidden state always has a positive channel 0 that lm_head uses to
        # push special tokens (eos included) and non-text bytes 40+ logits down:
        # output is printable ASCII and runs to max_tokens unless logit_bias says otherwise.
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.input_layernorm.weight[0] = 0.0
            layer.post_attention_layernorm.weight[0] = 0.0
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[banned] = 0.0
        model.lm_head.weight[banned, 0] = -100.0
    model.save_pretrained(out)
    # Overwrite the generated file: only token ids, no sampling defaults.
    generation = {f"{name}_token_id": value for name, value in ids.items()}
    _write_json(out / "generation_config.json", generation)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def is_complete(target: Path, version: str = BUILDER_VERSION) -> bool:
    """True if `target` holds a directory written by this version of its builder."""
    try:
        return (Path(target) / MARKER).read_text(encoding="utf-8").strip() == version
    except OSError:
        return False


def build(target: Path, *, force: bool = False) -> Path:
    """Ensure a complete tiny model exists at `target` and return its path."""
    return build_atomically(target, BUILDER_VERSION, lambda out: _build_weights(out, _build_tokenizer(out)),
                            force=force)


def build_atomically(target: Path, version: str, write: Callable[[Path], None], *, force: bool = False) -> Path:
    """Run `write` into a fresh directory and move it to `target` whole, marked with `version`; a
    directory already marked with it is kept (a concurrent builder may finish first)."""
    target = Path(target)
    if not force and is_complete(target, version):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        (tmp / MARKER).write_text(version + "\n", encoding="utf-8")
        for path in (tmp, *tmp.iterdir()):  # mkdtemp and safetensors create private files
            path.chmod(0o755 if path.is_dir() else 0o644)
        if not force and is_complete(target, version):
            return target  # a concurrent builder finished first
        if target.exists():
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, stale / "model")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            # A concurrent builder got there first; its result is as good as ours.
            if not is_complete(target, version):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
