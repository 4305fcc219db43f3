"""Structured outputs: `response_format` (and forced tool calls) → vLLM's StructuredOutputsParams."""

from typing import Any

from app.errors import bad_request
from app.protocol.chat import ChatCompletionRequest, JsonObjectFormat, JsonSchemaFormat
from app.serving.tools import ToolPlan


def structured_outputs(request: ChatCompletionRequest, tools: ToolPlan) -> Any:
    response_format = request.response_format
    if tools.schema is None and not isinstance(response_format, (JsonObjectFormat, JsonSchemaFormat)):
        return None  # the common case: unconstrained
    from vllm.sampling_params import StructuredOutputsParams

    if tools.schema is not None:
        return StructuredOutputsParams(json=tools.schema)
    if isinstance(response_format, JsonObjectFormat):
        return StructuredOutputsParams(json_object=True)
    if isinstance(response_format, JsonSchemaFormat):
        if response_format.json_schema.schema is None:
            raise bad_request("response_format `json_schema` needs `json_schema.schema`: the JSON schema the "
                              "output must follow.", "response_format.json_schema.schema")
        return StructuredOutputsParams(json=response_format.json_schema.schema)
    return None
