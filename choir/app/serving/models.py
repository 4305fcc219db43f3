"""Which model a request names, across the server's engines (choir/engine/roles.py): the generation
engine's names (aliases) and LoRA adapters, and each pooling role's names. A name another role serves gets
a 400 saying where it is served; a name nobody serves, the compat profile's `unknown_model` answer."""

from dataclasses import dataclass

from choir.core.errors import APIError, bad_request
from choir.core.settings import pooling_variable
from choir.engine.protocol import PoolingEngine, Tokenizing
from choir.engine.roles import ROLES
from choir.plugins.pipeline import Pipeline


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
    _served_by_another_role(pipeline, requested, "generate")
    pipeline.compat.check_model(requested, (*engine.served_model_names, *adapters))
    return ModelChoice(requested or engine.served_model_names[0])


def pooling_model(pipeline: Pipeline, role: str, requested: str | None) -> tuple[str, PoolingEngine]:
    """The model to report, and the role's engine."""
    engine = pipeline.engines.pooling(role)
    if engine is None:
        raise APIError(404, f"This server serves no model that {ROLES[role].does}: start it with "
                            f"{pooling_variable(role)} set.", "model")
    _served_by_another_role(pipeline, requested, role)
    pipeline.compat.check_model(requested, engine.served_model_names)
    return requested or engine.served_model_names[0], engine


def tokenizing_engine(pipeline: Pipeline, requested: str | None) -> Tokenizing:
    """/tokenize and /detokenize serve every model: a pooling model's name means its engine's tokenizer, an
    adapter's its base model's."""
    role = pipeline.engines.role_of(requested) if requested is not None else None
    if role is not None and role != "generate":
        return pipeline.engines.by_role[role]
    generation_model(pipeline, requested)
    return pipeline.engine


def _served_by_another_role(pipeline: Pipeline, requested: str | None, role: str) -> None:
    other = pipeline.engines.role_of(requested) if requested is not None else None
    if other is not None and other != role:
        names = ", ".join(pipeline.engines.names(role))
        raise bad_request(f"`{requested}` is a model that {ROLES[other].does}: {ROLES[other].endpoints} serves it. "
                          f"This endpoint serves {names}.", "model")
