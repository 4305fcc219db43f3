from pathlib import Path

from app.errors import APIError
from app.protocol.models import ModelCard, ModelList
from app.routes.request_ids import now
from plugins.engine.protocol import EngineDependency
from plugins.spec import operation


def _card(engine, name: str, created: int) -> ModelCard:
    return ModelCard(id=name, created=created, owned_by="choir", root=engine.model_root,
                     max_model_len=engine.max_model_len)


@operation("listModels")
async def list_models(engine: EngineDependency) -> ModelList:
    created = now()
    return ModelList(data=[_card(engine, name, created) for name in engine.served_model_names])


@operation("retrieveModel")
async def retrieve_model(model: Path, engine: EngineDependency) -> ModelCard:
    model = str(model).lstrip("/")  # a `path` parameter (model ids may contain slashes)
    if model not in engine.served_model_names:
        raise APIError(404, f"The model `{model}` does not exist. Served: {', '.join(engine.served_model_names)}.",
                       "model")
    return _card(engine, model, now())
