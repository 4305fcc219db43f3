
from app.protocol.models import ModelCard, ModelList
from app.routes.request_ids import now
from plugins.engine.protocol import EngineDependency
from plugins.spec import operation


@operation("listModels")
async def list_models(engine: EngineDependency) -> ModelList:
    created = now()
    return ModelList(data=[
        ModelCard(id=name, created=created, owned_by="choir", root=engine.model_root,
                  max_model_len=engine.max_model_len)
        for name in engine.served_model_names
    ])
