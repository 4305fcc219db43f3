"""Build `choir-tiny-vlm`, a tiny random-weight vision-language model, offline, beside the bundled tiny model
(choir/tiny/text.py builds that):

- LLaVA-shaped (`LlavaForConditionalGeneration`): a tiny CLIP vision tower (56x56 images in 14x14 patches,
  the class token dropped: IMAGE_TOKENS `<image>` tokens per image), a two-layer projector, and the bundled
  model's Llama as the language model, its weights copied, so text comes out as there: printable ASCII
  gibberish that runs to max_tokens.
- The bundled model's tokenizer plus one special token, `<image>` (the last id; lm_head never picks it).
- A slow (PIL and NumPy) CLIP image processor and a LlavaProcessor whose image-token count matches the
  model's, and a chat template that renders OpenAI content lists in order: text parts as text, each image
  part as `<image>`, so a message can hold several images between its texts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from choir.tiny.text import BUILDER_VERSION as MODEL_VERSION
from choir.tiny.text import EOS, MARKUP_TOKENS, _is_plain_text, _write_json, build_atomically, extend_tokenizer

VLM_VERSION = MODEL_VERSION + "-vlm-" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 56
PATCH_SIZE = 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # the class token is dropped ("default" feature selection)
# OpenAI CLIP's normalisation, as the CLIP image processors default to.
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]

# The bundled model's template, with content lists rendered part by part. vLLM hands a template that loops
# over message['content'] ("openai" content format) the parts as dicts: {"type": "text", "text": ...} and
# {"type": "image"} for each image (image_url parts included); "image_url" and "input_image" are matched too,
# for requests rendered by transformers' own apply_chat_template.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is not none %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    f"{{% elif part['type'] in ['image', 'image_url', 'input_image'] %}}{{{{ '{IMAGE_TOKEN}' }}}}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}"
    "{% if enable_thinking is defined and enable_thinking %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)


def build_vlm(target: Path, base: Path, *, force: bool = False) -> Path:
    """Ensure `target` holds the tiny vision-language model made from the tiny model at `base`."""
    return build_atomically(target, VLM_VERSION, lambda out: _write_vlm(out, Path(base)), force=force)


def _write_vlm(out: Path, base: Path) -> None:
    tok = extend_tokenizer(out, base, [IMAGE_TOKEN], CHAT_TEMPLATE)
    _write_weights(out, base, tok)
    _write_processor(out)


def _write_weights(out: Path, base: Path, tok: Any) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import CLIPVisionConfig, LlamaForCausalLM, LlavaConfig, LlavaForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    text = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    image_id = tok.token_to_id(IMAGE_TOKEN)
    vocab = tok.get_vocab_size()
    assert image_id == vocab - 1 == text.config.vocab_size, "<image> must be the one token added to the base's"
    text_config = text.config.to_dict()
    text_config.update(vocab_size=vocab)
    text_config.pop("_name_or_path", None)
    vision_config = CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=64,
        initializer_range=0.1,
    )
    config = LlavaConfig(
        vision_config=vision_config.to_dict(),
        text_config=text_config,
        image_token_index=image_id,
        image_seq_length=IMAGE_TOKENS,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(5)
    model = LlavaForConditionalGeneration(config)
    language = model.model.language_model
    markup = {tok.token_to_id(t) for t in MARKUP_TOKENS}
    new_row = torch.zeros(1, text.config.hidden_size)
    with torch.no_grad():
        # The base model's weights, its rows for the old vocabulary as they are.
        state = dict(text.model.state_dict())
        state["embed_tokens.weight"] = torch.cat([state["embed_tokens.weight"], new_row])
        language.load_state_dict(state)
        model.lm_head.weight.copy_(torch.cat([text.lm_head.weight, new_row]))
        # The base's residual channel 0 held at 1, for image positions too (the projector writes a 1 there),
        # and <image> pushed down in lm_head as the base's special tokens are: it is never sampled.
        language.embed_tokens.weight[image_id, 0] = 1.0
        projector = model.model.multi_modal_projector
        projector.linear_2.weight[0] = 0.0
        projector.linear_2.bias[0] = 1.0
        model.lm_head.weight[image_id, 0] = -100.0
    banned = [i for i in range(vocab) if i in markup or not _is_plain_text(tok.decode([i]))]
    assert image_id in banned and all(model.lm_head.weight[i, 0] == -100.0 for i in banned)
    # The classic llava-hf key layout, which both vLLM and transformers load (transformers 5 would save the
    # vision tower's keys without their `vision_model.` prefix, which vLLM 0.32 does not map).
    save_file({_checkpoint_key(key): value.contiguous() for key, value in model.state_dict().items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["LlavaForConditionalGeneration"]
    config.save_pretrained(out)
    ids = {f"{name}_token_id": getattr(text.config, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    assert tok.token_to_id(EOS) == ids["eos_token_id"]
    _write_json(out / "generation_config.json", ids)


def _checkpoint_key(key: str) -> str:
    for prefix, saved in (("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
                          ("model.vision_tower.", "vision_tower.vision_model."),
                          ("model.multi_modal_projector.", "multi_modal_projector.")):
        if key.startswith(prefix):
            return saved + key.removeprefix(prefix)
    raise ValueError(f"unexpected weight {key}")


def _write_processor(out: Path) -> None:
    # image_processor_type names the class family, not a backend: transformers 5 takes CLIPImageProcessorPil (PIL
    # and NumPy) where torchvision is missing, as on the CPU install, and the torchvision one where it is installed.
    _write_json(out / "preprocessor_config.json", {
        "image_processor_type": "CLIPImageProcessor", "processor_class": "LlavaProcessor",
        "do_resize": True, "size": {"shortest_edge": IMAGE_SIZE}, "resample": 3,  # bicubic
        "do_center_crop": True, "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD, "do_convert_rgb": True})
    # The processor counts (56 / 14)^2 patches + 1 class token, less 1 for "default": IMAGE_TOKENS, as the model.
    _write_json(out / "processor_config.json", {
        "processor_class": "LlavaProcessor", "image_token": IMAGE_TOKEN, "patch_size": PATCH_SIZE,
        "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1})
