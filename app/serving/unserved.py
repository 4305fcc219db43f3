"""vLLM request fields Choir does not serve. Each is accepted at its default value (clients that send
every field with its default keep working) and refused otherwise, with a 400 that names it and says
why: vLLM's server honours them, so ignoring them would silently change the answer."""

from typing import Any

from core.errors import bad_request

# field: (the value that changes nothing, why Choir refuses any other)
UNSERVED: dict[str, tuple[Any, str]] = {
    "use_beam_search": (False, "beam search is not served: sample with `n`, or `best_of` to keep the likeliest"),
    "length_penalty": (1.0, "length_penalty applies to beam search, which is not served"),
    "prompt_embeds": (None, "prompt embeddings are not served: send the prompt as text or token ids"),
    "kv_transfer_params": (None, "disaggregated prefill (KV transfer) is not served"),
    "ec_transfer_params": (None, "disaggregated encoders (EC transfer) are not served"),
    "routed_experts_prompt_start": (0, "routed-expert data is not returned"),
    "return_token_offsets": (None, "token offsets are only returned by vLLM's render endpoints"),
    "mm_payload": (None, "multimodal payloads are only returned by vLLM's render endpoints"),
    "return_mm_kwargs": (None, "multimodal payloads are only returned by vLLM's render endpoints"),
}
CHAT_UNSERVED: dict[str, tuple[Any, str]] = {
    "echo": (False, "chat `echo` is not served: prepend the last message yourself"),
    "chat_template": (None, "a request may not bring its own chat template: the server renders the model's"),
    "media_io_kwargs": (None, "the served model reads text only"),
    "mm_processor_kwargs": (None, "the served model reads text only"),
    "return_prompt_text": (None, "the rendered prompt text is not returned: POST /tokenize shows the prompt's tokens"),
}
EMBEDDING_UNSERVED: dict[str, tuple[Any, str]] = {
    "priority": (0, "embeddings are not scheduled by priority on this server"),
    "padding": (None, "padding the input is not served: it is embedded as tokenized"),
}
_FALSE_LIKE = {None: (None, False), False: (None, False)}


def refuse_unserved(request: Any, table: dict[str, tuple[Any, str]] = UNSERVED) -> None:
    for name, (default, why) in table.items():
        value = getattr(request, name, default)
        if value != default and value not in _FALSE_LIKE.get(default, ()):
            raise bad_request(f"{name} is not supported by this server: {why}.", name)
    structured = getattr(request, "structured_outputs", None)
    if structured is not None and table is UNSERVED:
        for name in ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"):
            if getattr(structured, name):
                raise bad_request(
                    f"structured_outputs.{name} is a server setting in vLLM, which ignores it per request: set it "
                    f"with `--structured-outputs-config.{name}` in CHOIR_ENGINE_ARGS.", f"structured_outputs.{name}")
