"""GET /v1/models and /v1/models/{model}: every name the server answers to. The generation model's
names (aliases), its LoRA adapters (`parent` = the base), and each pooling role's model names."""

from pathlib import Path

from litestar import Request

from choir.app.request_ids import now
from choir.core.errors import APIError
from choir.core.protocol.models import ModelCard, ModelList
from choir.engine.roles import Engines
from choir.plugins.engine.config import EnginesDependency
from choir.plugins.spec import operation, operation_compat


def _cards(request: Request, engines: Engines, created: int) -> list[ModelCard]:
    """Every role's names, generation's first. A served name's `root` is the model's path, or the name itself
    (the profile's `model_root`); an adapter's is its path."""
    by_name = operation_compat(request).rules.model_root == "served_name"
    cards = []
    for role, engine in engines:
        cards += [ModelCard(id=name, created=created, owned_by="choir", root=name if by_name else engine.model_root,
                            max_model_len=engine.max_model_len) for name in engine.served_model_names]
        if role == "generate":
            generator = engines.generate
            cards += [ModelCard(id=name, created=created, owned_by="choir", root=path,
                                parent=generator.adapter_parent(name), max_model_len=generator.max_model_len)
                      for name, path in generator.adapters.items()]
    return cards


@operation("listModels")
async def list_models(request: Request, engines: EnginesDependency) -> ModelList:
    return ModelList(data=_cards(request, engines, now()))


@operation("retrieveModel")
async def retrieve_model(model: Path, request: Request, engines: EnginesDependency) -> ModelCard:
    name = str(model).lstrip("/")  # a `path` parameter (model ids may contain slashes)
    cards = _cards(request, engines, now())
    for card in cards:
        if card.id == name:
            return card
    raise APIError(404, f"The model `{name}` does not exist. Served: {', '.join(c.id for c in cards)}.", "model")
