"""Which model a request names, across the server's engines: the generation engine's names (aliases)
and LoRA adapters, and the embedding engine's names. A name served by the other kind of engine gets a
400 saying where it is served; a name nobody serves, the compat profile's `unknown_model` answer."""

from dataclasses import dataclass

from core.errors import APIError, bad_request
from plugins.engine.protocol import Tokenizing
from plugins.pipeline import Pipeline


@dataclass(frozen=True, slots=True)
class ModelChoice:
    name: str  # what the response reports: the name sent (an alias, an adapter), else the first served name
    adapter: str | None = None  # a LoRA adapter of the generation engine


def generation_model(pipeline: Pipeline, requested: str | None, lora_path: str | None = None) -> ModelChoice:
    """SGLang's ways to name an adapter under its base model (where the profile honours SGLang's fields):
    `lora_path`, or `model: "base:adapter"`; the response reports the `model` sent."""
    engine = pipeline.engine
    adapters = engine.adapters
    if requested is not None and requested in adapters:
        return ModelChoice(requested, adapter=requested)
    base = requested
    if requested is not None and ":" in requested and pipeline.compat.rules.sglang_fields == "honour":
        named_base, _, named_adapter = requested.partition(":")
        if named_base in engine.served_model_names and named_adapter:
            base, lora_path = named_base, named_adapter
    if lora_path is not None:
        if lora_path not in adapters:
            raise bad_request(f"The LoRA adapter `{lora_path}` is not loaded. Loaded adapters: "
                              f"{', '.join(adapters) or 'none'}.", "lora_path" if base == requested else "model")
        pipeline.compat.check_model(base, engine.served_model_names)
        return ModelChoice(requested or engine.served_model_names[0], adapter=lora_path)
    embedding = pipeline.embedding
    if requested is not None and embedding is not None and requested in embedding.served_model_names:
        raise bad_request(f"`{requested}` is an embedding model: POST /v1/embeddings serves it. This endpoint "
                          f"serves {', '.join((*engine.served_model_names, *adapters))}.", "model")
    pipeline.compat.check_model(requested, (*engine.served_model_names, *adapters))
    return ModelChoice(requested or engine.served_model_names[0])


def embedding_model(pipeline: Pipeline, requested: str | None) -> str:
    embedding, engine = pipeline.embedding, pipeline.engine
    if embedding is None:
        raise APIError(404, "This server serves no embedding model: start it with CHOIR_EMBEDDING_MODEL set.",
                       "model")
    if requested is not None and (requested in engine.served_model_names or requested in engine.adapters):
        raise bad_request(f"`{requested}` is a generation model: /v1/embeddings serves "
                          f"{', '.join(embedding.served_model_names)}.", "model")
    pipeline.compat.check_model(requested, embedding.served_model_names)
    return requested or embedding.served_model_names[0]


def tokenizing_engine(pipeline: Pipeline, requested: str | None) -> Tokenizing:
    """/tokenize and /detokenize serve every model: an embedding model's name means its engine's tokenizer,
    an adapter's means its base model's."""
    embedding = pipeline.embedding
    if requested is not None and embedding is not None and requested in embedding.served_model_names:
        return embedding
    generation_model(pipeline, requested)
    return pipeline.engine
