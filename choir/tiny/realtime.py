"""Build `choir-tiny-realtime`, a tiny random-weight streaming speech model, offline, beside the bundled tiny model,
so vLLM's own Qwen3-ASR realtime code serves `/v1/realtime` (and the audio endpoints) on it:

- Qwen3-ASR-shaped, as vLLM's `Qwen3ASRRealtimeGeneration`: a one-layer audio encoder of width 64 (128 mel bins,
  Qwen3-ASR's feature extractor: 13 audio tokens a second), its two-layer projector, and the bundled model's Llama
  weights as its Qwen3 language model (the same layers; Qwen3's q/k norms ones; multimodal RoPE, which on text is
  plain RoPE), so text comes out as there: printable ASCII gibberish that runs to its token limit.
- The bundled model's tokenizer plus Qwen3-ASR's prompt tokens (`<|im_start|>`, `<|im_end|>`, `<|audio_start|>`,
  `<|audio_pad|>`, `<|audio_end|>`, `<asr_text>`), never sampled, and Qwen3-ASR's processor.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from choir.tiny.text import BUILDER_VERSION as MODEL_VERSION
from choir.tiny.text import EOS, MARKUP_TOKENS, _is_plain_text, _write_json, build_atomically, extend_tokenizer

REALTIME_VERSION = MODEL_VERSION + "-realtime-" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
AUDIO_START, AUDIO_PAD, AUDIO_END = "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"
ASR_TEXT = "<asr_text>"
ADDED = [IM_START, IM_END, AUDIO_START, AUDIO_PAD, AUDIO_END, ASR_TEXT]
MEL_BINS = 128
SAMPLE_RATE = 16000
WINDOW_SECONDS = 30  # the feature extractor's chunk: vLLM's transcription endpoint splits longer audio there

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is not none %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ['audio', 'audio_url', 'input_audio'] %}"
    "{{ '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_realtime(target: Path, base: Path, *, force: bool = False) -> Path:
    """Ensure `target` holds the tiny streaming speech model made from the tiny model at `base`."""
    return build_atomically(target, REALTIME_VERSION, lambda out: _write(out, Path(base)), force=force)


def _write(out: Path, base: Path) -> None:
    tok = extend_tokenizer(out, base, ADDED, CHAT_TEMPLATE, audio_token=AUDIO_PAD, audio_bos_token=AUDIO_START,
                           audio_eos_token=AUDIO_END)
    _write_weights(out, base, tok)
    _write_processor(out)


def _write_weights(out: Path, base: Path, tok: Any) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM, Qwen3ASRConfig, Qwen3ASRForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    text = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    vocab = tok.get_vocab_size()
    added = [tok.token_to_id(t) for t in ADDED]
    assert added == list(range(text.config.vocab_size, vocab)), "the prompt tokens must be the ones added"
    base_config = text.config
    head_dim = base_config.hidden_size // base_config.num_attention_heads
    text_config = dict(
        model_type="qwen3", vocab_size=vocab, hidden_size=base_config.hidden_size,
        intermediate_size=base_config.intermediate_size, num_hidden_layers=base_config.num_hidden_layers,
        num_attention_heads=base_config.num_attention_heads, num_key_value_heads=base_config.num_key_value_heads,
        head_dim=head_dim, max_position_embeddings=base_config.max_position_embeddings,
        rms_norm_eps=base_config.rms_norm_eps, tie_word_embeddings=False,
        rope_theta=base_config.rope_parameters["rope_theta"])
    audio_config = dict(num_mel_bins=MEL_BINS, encoder_layers=1, encoder_attention_heads=1, encoder_ffn_dim=128,
                        d_model=64, output_dim=base_config.hidden_size, downsample_hidden_size=32, n_window=50,
                        n_window_infer=800)
    torch.manual_seed(7)
    model = Qwen3ASRForConditionalGeneration(Qwen3ASRConfig(
        audio_config=dict(audio_config), text_config=dict(text_config), audio_token_id=added[3],
        tie_word_embeddings=False))
    language = model.model.language_model
    new_rows = torch.zeros(len(added), base_config.hidden_size)
    with torch.no_grad():
        state = dict(text.model.state_dict())
        state["embed_tokens.weight"] = torch.cat([state["embed_tokens.weight"], new_rows])
        missing, unexpected = language.load_state_dict(state, strict=False)
        assert not unexpected and all(key.endswith(("q_norm.weight", "k_norm.weight")) for key in missing), (
            missing, unexpected)
        for key in missing:
            language.get_parameter(key).fill_(1.0)
        model.lm_head.weight.copy_(torch.cat([text.lm_head.weight, new_rows]))
        # As in choir-tiny-audio: channel 0 held at 1 (the projector writes a 1 there at audio positions) and the
        # added tokens pushed down in lm_head as the base's special tokens are: never sampled.
        for token in added:
            language.embed_tokens.weight[token, 0] = 1.0
            model.lm_head.weight[token, 0] = -100.0
        projector = model.model.multi_modal_projector.linear_2
        projector.weight[0] = 0.0
        projector.bias[0] = 1.0
    markup = {tok.token_to_id(t) for t in MARKUP_TOKENS}
    banned = [i for i in range(vocab) if i in markup or not _is_plain_text(tok.decode([i]))]
    assert all(model.lm_head.weight[i, 0] == -100.0 for i in banned)
    save_file({_checkpoint_key(key): value.contiguous() for key, value in model.state_dict().items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    # vLLM's own Qwen3-ASR config (model_type qwen3_asr, a thinker holding the audio and text configs).
    text_config.pop("model_type")
    text_config["rope_scaling"] = {"rope_type": "default", "mrope_section": [head_dim // 4, head_dim // 8,
                                                                             head_dim // 8], "interleaved": True}
    eos = tok.token_to_id(EOS)
    _write_json(out / "config.json", {
        "architectures": ["Qwen3ASRRealtimeGeneration"], "model_type": "qwen3_asr", "dtype": "float32",
        "thinker_config": {"audio_config": audio_config, "text_config": text_config, "audio_token_id": added[3],
                           "audio_start_token_id": added[2]},
        "eos_token_id": eos, "pad_token_id": base_config.pad_token_id, "bos_token_id": base_config.bos_token_id})
    ids = {f"{name}_token_id": getattr(base_config, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    assert eos == ids["eos_token_id"]
    _write_json(out / "generation_config.json", ids)


def _checkpoint_key(key: str) -> str:
    """The layout vLLM's Qwen3-ASR loads (Qwen/Qwen3-ASR's `thinker.` checkpoints)."""
    for prefix, saved in (("model.language_model.", "thinker.model."), ("lm_head.", "thinker.lm_head."),
                          ("model.audio_tower.", "thinker.audio_tower."),
                          ("model.multi_modal_projector.linear_1.", "thinker.audio_tower.proj1."),
                          ("model.multi_modal_projector.linear_2.", "thinker.audio_tower.proj2.")):
        if key.startswith(prefix):
            return saved + key.removeprefix(prefix)
    raise ValueError(f"unexpected weight {key}")


def _write_processor(out: Path) -> None:
    _write_json(out / "preprocessor_config.json", {
        "feature_extractor_type": "Qwen3ASRFeatureExtractor", "processor_class": "Qwen3ASRProcessor",
        "feature_size": MEL_BINS, "sampling_rate": SAMPLE_RATE, "hop_length": 160, "chunk_length": WINDOW_SECONDS,
        "n_fft": 400, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True})
    _write_json(out / "processor_config.json", {"processor_class": "Qwen3ASRProcessor"})
