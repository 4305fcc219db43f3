"""Build `choir-tiny-whisper`, a tiny random-weight Whisper (`WhisperForConditionalGeneration`), offline, so
vLLM's own Whisper code, processor and speech-to-text serving run on it:

- A byte-level BPE trained on the bundled model's corpus, with Whisper's special tokens after it in Whisper's
  order (`<|endoftext|>`, `<|startoftranscript|>`, one `<|xx|>` per language, `<|translate|>`,
  `<|transcribe|>`, `<|startoflm|>`, `<|startofprev|>`, `<|nospeech|>`, `<|notimestamps|>`) and then the
  timestamps `<|0.00|>` … `<|30.00|>` as plain added tokens, where Whisper's tokenizer looks for them.
- Whisper's feature extractor (80 mel bins, 16 kHz) over a WINDOW_SECONDS window: audio longer than it is
  split into chunks as vLLM splits Whisper's 30 s, with seconds of audio, not minutes.
- One encoder and one decoder layer of width 64 (the CPU attention backend's head size). The output
  embedding is the input one (Whisper ties them); the decoder's last layer norm holds channel 0 at 1, so
  channel 0 of each token's embedding is its logit bias: special tokens are never picked on their own
  (language detection, which allows only languages, still picks one), timestamps seldom, text always
  printable ASCII, and a transcript runs to its token limit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from choir.tiny.text import BUILDER_VERSION as MODEL_VERSION
from choir.tiny.text import _is_plain_text, build_atomically, train_bpe

SPEECH_VERSION = MODEL_VERSION + "-whisper-" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
WINDOW_SECONDS = 5
SAMPLE_RATE = 16000
HOP_LENGTH = 160
MEL_BINS = 80
VOCAB_SIZE = 512
MAX_TARGET_POSITIONS = 128  # the decoder's context: prompt and transcript of one chunk
EOT = "<|endoftext|>"
TIMESTAMPS = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
TIMESTAMP_BIAS = -3.0  # a timestamp now and then, so verbose_json has segments to show


def build_speech(target: Path, *, force: bool = False) -> Path:
    """Ensure `target` holds the tiny Whisper."""
    return build_atomically(target, SPEECH_VERSION, _write, force=force)


def _specials() -> list[str]:
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    languages = [f"<|{code}|>" for code in LANGUAGES]
    return [EOT, "<|startoftranscript|>", *languages, "<|translate|>", "<|transcribe|>", "<|startoflm|>",
            "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]


def _write(out: Path) -> None:
    tokenizer = _write_processor(out)
    _write_weights(out, tokenizer)


def _write_processor(out: Path) -> Any:
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer

    bpe = train_bpe(VOCAB_SIZE)
    saved = json.loads(bpe.to_str())["model"]
    vocab, merges = saved["vocab"], [tuple(pair) for pair in saved["merges"]]
    tokenizer = WhisperTokenizer(vocab=vocab, merges=merges, unk_token=EOT, bos_token=EOT, eos_token=EOT,
                                 pad_token=EOT)
    tokenizer.add_special_tokens({"additional_special_tokens": _specials()[1:]})
    tokenizer.add_tokens(TIMESTAMPS)
    extractor = WhisperFeatureExtractor(feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE, hop_length=HOP_LENGTH,
                                        chunk_length=WINDOW_SECONDS)
    WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(out)
    return tokenizer


def _write_weights(out: Path, tokenizer: Any) -> None:
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    eot = tokenizer.convert_tokens_to_ids(EOT)
    start = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=MEL_BINS,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=1,
        decoder_attention_heads=1,
        d_model=64,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=WINDOW_SECONDS * SAMPLE_RATE // HOP_LENGTH // 2,  # the encoder's second conv halves
        max_target_positions=MAX_TARGET_POSITIONS,
        init_std=0.1,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        decoder_start_token_id=start,
        suppress_tokens=[],
        begin_suppress_tokens=[],
        dtype="float32",
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    timestamps = set(tokenizer.convert_tokens_to_ids(TIMESTAMPS))
    decoder = model.model.decoder
    with torch.no_grad():
        embeddings = decoder.embed_tokens.weight
        embeddings[:, 0] = 0.0
        for i in range(config.vocab_size):
            if i in timestamps:
                embeddings[i, 0] = TIMESTAMP_BIAS
            elif not _is_plain_text(tokenizer.decode([i])):
                embeddings[i, 0] = -100.0
        decoder.embed_positions.weight[:, 0] = 0.0
        for layer in decoder.layers:  # no layer reads channel 0 (nor writes it)
            for norm in (layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm):
                norm.weight[0] = 0.0
                norm.bias[0] = 0.0
            layer.self_attn.out_proj.weight[0] = 0.0
            layer.self_attn.out_proj.bias[0] = 0.0
            layer.encoder_attn.out_proj.weight[0] = 0.0
            layer.encoder_attn.out_proj.bias[0] = 0.0
            layer.fc2.weight[0] = 0.0
            layer.fc2.bias[0] = 0.0
        decoder.layer_norm.weight[0] = 0.0
        decoder.layer_norm.bias[0] = 1.0
    model.generation_config.forced_decoder_ids = None
    model.save_pretrained(out)
