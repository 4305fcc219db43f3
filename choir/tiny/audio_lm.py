"""Build `choir-tiny-audio`, a tiny random-weight audio-language model, offline, beside the bundled tiny model
(choir/tiny/text.py builds that), for audio parts in chat:

- Qwen2-Audio-shaped (`Qwen2AudioForConditionalGeneration`): a one-layer Whisper-style audio encoder (128 mel bins,
  a WINDOW_SECONDS window: at most (WINDOW_SECONDS * 25) audio tokens an audio, 25 a second), a projector, and the
  bundled model's Llama weights as its Qwen2 language model (the same layers; Qwen2's q/k/v biases zero), so text
  comes out as there: printable ASCII gibberish that runs to max_tokens.
- The bundled model's tokenizer plus Qwen2-Audio's three special tokens (`<|audio_bos|>`, `<|AUDIO|>`,
  `<|audio_eos|>`, never sampled), Qwen2-Audio's processor (Whisper's feature extractor) and a chat template that
  renders OpenAI content lists in order: text parts as text, each audio part as `<|audio_bos|><|AUDIO|><|audio_eos|>`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from choir.tiny.text import BUILDER_VERSION as MODEL_VERSION
from choir.tiny.text import EOS, MARKUP_TOKENS, _is_plain_text, _write_json, build_atomically, extend_tokenizer

AUDIO_LM_VERSION = MODEL_VERSION + "-audio-" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
AUDIO_BOS, AUDIO_TOKEN, AUDIO_EOS = "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"
WINDOW_SECONDS = 30  # vLLM's Qwen2-Audio takes 3000 mel frames: 30 s, padded
MEL_BINS = 128
TOKENS_PER_SECOND = 25  # 100 mel frames a second, halved by the encoder's conv and again by its pooling

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is not none %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    f"{{% elif part['type'] in ['audio', 'audio_url', 'input_audio'] %}}"
    f"{{{{ '{AUDIO_BOS}{AUDIO_TOKEN}{AUDIO_EOS}' }}}}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def build_audio_lm(target: Path, base: Path, *, force: bool = False) -> Path:
    """Ensure `target` holds the tiny audio-language model made from the tiny model at `base`."""
    return build_atomically(target, AUDIO_LM_VERSION, lambda out: _write(out, Path(base)), force=force)


def _write(out: Path, base: Path) -> None:
    tok = extend_tokenizer(out, base, [AUDIO_BOS, AUDIO_TOKEN, AUDIO_EOS], CHAT_TEMPLATE, audio_bos_token=AUDIO_BOS,
                           audio_token=AUDIO_TOKEN, audio_eos_token=AUDIO_EOS)
    _write_weights(out, base, tok)
    _write_processor(out)


def _write_weights(out: Path, base: Path, tok: Any) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM, Qwen2AudioConfig, Qwen2AudioEncoderConfig, Qwen2Config
    from transformers import Qwen2AudioForConditionalGeneration as Model
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    text = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    vocab = tok.get_vocab_size()
    added = [tok.token_to_id(t) for t in (AUDIO_BOS, AUDIO_TOKEN, AUDIO_EOS)]
    assert added == list(range(text.config.vocab_size, vocab)), "the audio tokens must be the ones added"
    base_config = text.config
    text_config = Qwen2Config(
        vocab_size=vocab, hidden_size=base_config.hidden_size, intermediate_size=base_config.intermediate_size,
        num_hidden_layers=base_config.num_hidden_layers, num_attention_heads=base_config.num_attention_heads,
        num_key_value_heads=base_config.num_key_value_heads,
        max_position_embeddings=base_config.max_position_embeddings, rms_norm_eps=base_config.rms_norm_eps,
        rope_parameters=base_config.rope_parameters, tie_word_embeddings=False,
        bos_token_id=base_config.bos_token_id, eos_token_id=base_config.eos_token_id,
        pad_token_id=base_config.pad_token_id)
    audio_config = Qwen2AudioEncoderConfig(
        num_mel_bins=MEL_BINS, encoder_layers=1, encoder_attention_heads=1, encoder_ffn_dim=128, d_model=64,
        max_source_positions=WINDOW_SECONDS * 50, init_std=0.1)
    config = Qwen2AudioConfig(audio_config=audio_config.to_dict(), text_config=text_config.to_dict(),
                              audio_token_index=added[1], dtype="float32")
    torch.manual_seed(7)
    model = Model(config)
    language = model.model.language_model
    new_rows = torch.zeros(len(added), base_config.hidden_size)
    with torch.no_grad():
        state = {key: value for key, value in text.model.state_dict().items()}
        state["embed_tokens.weight"] = torch.cat([state["embed_tokens.weight"], new_rows])
        missing, unexpected = language.load_state_dict(state, strict=False)
        assert not unexpected and all(key.endswith(".bias") for key in missing), (missing, unexpected)
        for key in missing:  # Qwen2's q/k/v biases: none in the Llama
            language.get_parameter(key).zero_()
        model.lm_head.weight.copy_(torch.cat([text.lm_head.weight, new_rows]))
        # The base's residual channel 0 held at 1, at audio positions too (the projector writes a 1 there), and
        # the audio tokens pushed down in lm_head as the base's special tokens are: never sampled.
        for token in added:
            language.embed_tokens.weight[token, 0] = 1.0
            model.lm_head.weight[token, 0] = -100.0
        projector = model.model.multi_modal_projector.linear
        projector.weight[0] = 0.0
        projector.bias[0] = 1.0
    markup = {tok.token_to_id(t) for t in MARKUP_TOKENS}
    banned = [i for i in range(vocab) if i in markup or not _is_plain_text(tok.decode([i]))]
    assert all(model.lm_head.weight[i, 0] == -100.0 for i in banned)
    save_file({_checkpoint_key(key): value.contiguous() for key, value in model.state_dict().items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    config.save_pretrained(out)
    ids = {f"{name}_token_id": getattr(base_config, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    assert tok.token_to_id(EOS) == ids["eos_token_id"]
    _write_json(out / "generation_config.json", ids)


def _checkpoint_key(key: str) -> str:
    """The layout vLLM's Qwen2-Audio loads (Qwen/Qwen2-Audio-7B-Instruct's)."""
    for prefix, saved in (("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
                          ("model.audio_tower.", "audio_tower."),
                          ("model.multi_modal_projector.", "multi_modal_projector.")):
        if key.startswith(prefix):
            return saved + key.removeprefix(prefix)
    raise ValueError(f"unexpected weight {key}")


def _write_processor(out: Path) -> None:
    _write_json(out / "preprocessor_config.json", {
        "feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "Qwen2AudioProcessor",
        "feature_size": MEL_BINS, "sampling_rate": 16000, "hop_length": 160, "chunk_length": WINDOW_SECONDS,
        "n_fft": 400, "n_samples": WINDOW_SECONDS * 16000, "nb_max_frames": WINDOW_SECONDS * 100,
        "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True})
    _write_json(out / "processor_config.json", {
        "processor_class": "Qwen2AudioProcessor", "audio_token": AUDIO_TOKEN, "audio_bos_token": AUDIO_BOS,
        "audio_eos_token": AUDIO_EOS})
