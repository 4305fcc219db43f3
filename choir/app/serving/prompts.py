"""Request-level checks every generation endpoint shares: model name, prompt forms, stream options."""

from typing import Any

from choir.app.serving.models import ModelChoice, generation_model
from choir.app.serving.unserved import refuse_unserved
from choir.core.errors import bad_request
from choir.core.protocol.common import SamplingFields, StreamOptions
from choir.plugins.pipeline import Pipeline


def check_common(pipeline: Pipeline, request: SamplingFields) -> ModelChoice:
    """Validate what both endpoints share; return the model (and LoRA adapter) the request names."""
    model = generation_model(pipeline, request.model, request.lora_path)
    refuse_unserved(request)
    temperature = request.temperature
    if temperature is None:
        temperature = pipeline.engine.default_sampling_params.get("temperature", 1.0)
    pipeline.compat.check_n(request.n, temperature)
    if request.stream_options is not None and not request.stream:
        raise bad_request("stream_options can only be set when stream is true.", "stream_options")
    defaults = pipeline.defaults
    if defaults.return_tokens_as_token_ids and request.return_tokens_as_token_ids is None:
        request.return_tokens_as_token_ids = True
    if defaults.force_include_usage and request.stream:
        options = request.stream_options or StreamOptions()
        request.stream_options = StreamOptions(include_usage=True, continuous_usage_stats=True,
                                               include_obfuscation=options.include_obfuscation)
    return model


def completion_prompts(prompt: str | list[Any] | None, param: str = "prompt") -> list[str] | list[list[int]]:
    """The four OpenAI prompt forms as a list of strings or a list of token-id lists."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:  # vLLM's words for completions (its tests match them)
        raise bad_request("Either prompt or prompt_embeds must be provided and non-empty." if param == "prompt"
                          else f"{param} must not be empty.", param)
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(_is_token_id(t) for t in prompt):
        return [list(prompt)]
    if all(isinstance(p, list) and p and all(_is_token_id(t) for t in p) for p in prompt):
        return [list(p) for p in prompt]
    raise bad_request(
        f"{param} must be a string, a list of strings, a list of token ids, or a list of non-empty token-id lists.",
        param)


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
