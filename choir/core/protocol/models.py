"""/v1/models wire types."""

from typing import Annotated, Literal

import msgspec


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str  # the model's directory (or hub id); an adapter's own path
    parent: str | None = None  # a LoRA adapter's base model
    max_model_len: int


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoraAdapterRequest(msgspec.Struct, kw_only=True):
    """vLLM's shape: the adapter becomes a model name of its own."""

    lora_name: Annotated[str, msgspec.Meta(min_length=1)]
    lora_path: Annotated[str, msgspec.Meta(min_length=1)]
    load_inplace: bool = False  # replace the adapter loaded under this name (its id stays)
    is_3d_lora_weight: bool = False  # vLLM's: the adapter's MoE weights are stored as 3D tensors


class UnloadLoraAdapterRequest(msgspec.Struct, kw_only=True):
    lora_name: Annotated[str, msgspec.Meta(min_length=1)]
    lora_int_id: int | None = None  # vLLM's; accepted, not needed (the name says which)
