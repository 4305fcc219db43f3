"""Build the bundled tiny model's companions, offline, beside it (choir/tiny/text.py builds the model):

- `choir-tiny-lora`: a rank-8 PEFT LoRA adapter for it (q_proj and v_proj), with weights large enough
  that a greedy request gives other tokens through the adapter than without it.
- `choir-tiny-embed`: a tiny random Llama embedding model with the same tokenizer (served by vLLM's
  pooling runner), Matryoshka-capable so that `dimensions` can be tested.
- `choir-tiny-rerank`: a tiny random cross-encoder (`LlamaForSequenceClassification`, one label: a
  relevance score per query and document pair), for /rerank and /score.
- `choir-tiny-classify`: a tiny random classifier (`LlamaForSequenceClassification`, three named labels),
  for /classify.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from choir.tiny.text import BUILDER_VERSION as MODEL_VERSION
from choir.tiny.text import build_atomically

EXTRAS_VERSION = MODEL_VERSION + "-" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
LORA_RANK = 8
LORA_TARGETS = ("q_proj", "v_proj")
MATRYOSHKA_DIMENSIONS = [32, 64, 128]
CROSS_ENCODER_LABELS = ("relevance",)  # one label: its logit is the pair's score
CLASSIFIER_LABELS = ("negative", "neutral", "positive")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_lora(target: Path, base: Path, *, force: bool = False) -> Path:
    return build_atomically(target, EXTRAS_VERSION, lambda out: _write_lora(out, base), force=force)


def build_embedding(target: Path, base: Path, *, force: bool = False) -> Path:
    return build_atomically(target, EXTRAS_VERSION, lambda out: _write_embedding(out, base), force=force)


def build_reranker(target: Path, base: Path, *, force: bool = False) -> Path:
    return build_atomically(target, EXTRAS_VERSION, lambda out: _write_classifier(out, base, CROSS_ENCODER_LABELS, 3),
                            force=force)


def build_classifier(target: Path, base: Path, *, force: bool = False) -> Path:
    return build_atomically(target, EXTRAS_VERSION, lambda out: _write_classifier(out, base, CLASSIFIER_LABELS, 4),
                            force=force)


def _write_lora(out: Path, base: Path) -> None:
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    kv_out = config["num_key_value_heads"] * config["head_dim"]
    generator = torch.Generator().manual_seed(1)
    tensors = {}
    for layer in range(layers):
        for module, out_features in (("q_proj", config["num_attention_heads"] * config["head_dim"]),
                                     ("v_proj", kv_out)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            # A scaled like a normal init; B far from PEFT's zeros, so the adapter changes what is sampled.
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(LORA_RANK, hidden, generator=generator) / hidden ** 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, LORA_RANK, generator=generator) * 2.0
    save_file(tensors, str(out / "adapter_model.safetensors"))
    _write_json(out / "adapter_config.json", {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "choir-tiny", "r": LORA_RANK,
        "lora_alpha": LORA_RANK, "lora_dropout": 0.0, "target_modules": list(LORA_TARGETS), "bias": "none",
        "fan_in_fan_out": False, "inference_mode": True})


def _write_embedding(out: Path, base: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    base_config = json.loads((base / "config.json").read_text())
    config = LlamaConfig(**{key: base_config[key] for key in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "bos_token_id", "eos_token_id", "pad_token_id")},
        max_position_embeddings=512, initializer_range=0.1, dtype="float32")
    torch.manual_seed(2)
    LlamaModel(config).save_pretrained(out)
    model_config = json.loads((out / "config.json").read_text())
    model_config.update(is_matryoshka=True, matryoshka_dimensions=MATRYOSHKA_DIMENSIONS)
    _write_json(out / "config.json", model_config)
    for name in TOKENIZER_FILES:
        shutil.copyfile(base / name, out / name)


def _write_classifier(out: Path, base: Path, labels: tuple[str, ...], seed: int) -> None:
    """A sequence classifier on the base model's shape and tokenizer: vLLM pools the last token and applies
    the `score` head (sigmoid for one label, softmax for several)."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    base_config = json.loads((base / "config.json").read_text())
    config = LlamaConfig(**{key: base_config[key] for key in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "bos_token_id", "eos_token_id", "pad_token_id")},
        max_position_embeddings=512, initializer_range=0.1, dtype="float32", num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copyfile(base / name, out / name)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
