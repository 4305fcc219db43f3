"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter: LoRA adapters at run time, as vLLM's
server takes them (off unless CHOIR_ALLOW_RUNTIME_LORA=true; behind the API key like all of /v1)."""

from typing import Any, TypeVar

from litestar import MediaType, Request, Response
from litestar.params import SkipValidation

from choir.core.errors import APIError, bad_request
from choir.core.protocol.models import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from choir.engine.protocol import RUNTIME_LORA_STATE_KEY, AdapterError, UnknownAdapter
from choir.plugins.pipeline import Pipeline, PipelineDependency
from choir.plugins.spec import operation

T = TypeVar("T")


def _admitted(request: Request, pipeline: Pipeline, data: Any, wire_type: type[T]) -> T:
    """The body, once run-time adapters are allowed and it passes the operation's rules."""
    if not request.app.state.get(RUNTIME_LORA_STATE_KEY, False):
        raise APIError(404, "Loading LoRA adapters at run time is off: start the server with "
                            "CHOIR_ALLOW_RUNTIME_LORA=true, or list them in CHOIR_LORA_MODULES.")
    return pipeline.compat.admit(data, wire_type)


@operation("loadLoraAdapter")
async def load_lora_adapter(data: SkipValidation[LoadLoraAdapterRequest], request: Request,
                            pipeline: PipelineDependency) -> Response:
    body = _admitted(request, pipeline, data, LoadLoraAdapterRequest)
    if pipeline.engines.role_of(body.lora_name) not in (None, "generate"):  # a pooling model's name
        raise bad_request(f"The model name `{body.lora_name}` is taken: choose another name for the adapter.",
                          "lora_name")
    try:
        await pipeline.engine.load_adapter(body.lora_name, body.lora_path, body.load_inplace, body.is_3d_lora_weight)
    except AdapterError as exc:
        raise bad_request(str(exc), f"lora_{exc.about}") from None
    return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type=MediaType.TEXT)


@operation("unloadLoraAdapter")
async def unload_lora_adapter(data: SkipValidation[UnloadLoraAdapterRequest], request: Request,
                              pipeline: PipelineDependency) -> Response:
    body = _admitted(request, pipeline, data, UnloadLoraAdapterRequest)
    try:
        await pipeline.engine.unload_adapter(body.lora_name)
    except UnknownAdapter:
        raise APIError(404, f"The LoRA adapter `{body.lora_name}` is not loaded: GET /v1/models lists those that "
                            "are.", "lora_name") from None
    return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.", media_type=MediaType.TEXT)
