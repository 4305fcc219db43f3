"""vLLM request fields Choir does not serve. Each is accepted at its default value (clients that send
every field with its default keep working) and refused otherwise, with a 400 that names it and says
why: vLLM's server honours them, so ignoring them would silently change the answer."""

from typing import Any

from choir.core.errors import bad_request

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
    # SGLang's (with `sglang_fields: honour`; the vllm profile drops them as unknown fields)
    "stop_regex": (None, "stop regexes are not served: send `stop` (strings) or `stop_token_ids`"),
    "session_params": (None, "SGLang sessions are not served: send the whole conversation (`session_id` is "
                             "passed to the engine)"),
    "custom_logit_processor": (None, "custom logit processors are not served: `logit_bias`, `allowed_token_ids` "
                                     "and `bad_words` shape the sampling"),
    "custom_params": (None, "custom logit processors are not served: `logit_bias`, `allowed_token_ids` and "
                            "`bad_words` shape the sampling"),
    "return_hidden_states": (False, "hidden states are not returned"),
    "return_routed_experts": (False, "routed-expert data is not returned"),
    "return_cached_tokens_details": (False, "`usage.prompt_tokens_details.cached_tokens` says how many prompt "
                                            "tokens the prefix cache held"),
    "ngram_corpus_id": (None, "n-gram speculative decoding corpora are not served"),
    "bootstrap_host": (None, "disaggregated prefill is not served"),
    "bootstrap_port": (None, "disaggregated prefill is not served"),
    "bootstrap_room": (None, "disaggregated prefill is not served"),
    "disagg_prefill_dp_rank": (None, "disaggregated prefill is not served"),
    "routed_dp_rank": (None, "this server does not route requests to a data-parallel rank"),
    "data_parallel_rank": (None, "this server does not route requests to a data-parallel rank"),
}
CHAT_UNSERVED: dict[str, tuple[Any, str]] = {
    "echo": (False, "chat `echo` is not served: prepend the last message yourself"),
    "chat_template": (None, "a request may not bring its own chat template: the server renders the model's"),
    "return_prompt_text": (None, "the rendered prompt text is not returned: POST /tokenize shows the prompt's tokens"),
    # SGLang's
    "input_ids": (None, "a chat prompt is rendered from `messages`: send token ids as the `prompt` of "
                        "/v1/completions"),
    "return_prompt_token_ids": (False, "send `return_token_ids`: the response then has `prompt_token_ids`"),
    "return_meta_info": (False, "engine meta info is not returned: `usage` and `return_token_ids` tell what it "
                                "would"),
    "max_dynamic_patch": (None, "send it in `mm_processor_kwargs`, as vLLM takes a processor's kwargs"),
    "min_dynamic_patch": (None, "send it in `mm_processor_kwargs`, as vLLM takes a processor's kwargs"),
}
EMBEDDING_UNSERVED: dict[str, tuple[Any, str]] = {
    "priority": (0, "embeddings are not scheduled by priority on this server"),
    "padding": (None, "padding the input is not served: it is embedded as tokenized"),
}
def refuse_unserved(request: Any, table: dict[str, tuple[Any, str]] = UNSERVED) -> None:
    for name, (default, why) in table.items():
        value = getattr(request, name, default)
        # null, false and an empty list all mean "off" where null or false is the default (0 is a value: a
        # rank, a count)
        unset = value is None or value is False or value == [] if default is None or default is False \
            else value == default
        if not unset:
            raise bad_request(f"{name} is not supported by this server: {why}.", name)
    structured = getattr(request, "structured_outputs", None)
    if structured is not None and table is UNSERVED:
        for name in ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"):
            if getattr(structured, name):
                raise bad_request(
                    f"structured_outputs.{name} is a server setting in vLLM, which ignores it per request: set it "
                    f"with `--structured-outputs-config.{name}` in CHOIR_ENGINE_ARGS.", f"structured_outputs.{name}")
