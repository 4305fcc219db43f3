"""/v1/messages wire types: Anthropic's Messages API, the part Choir serves (and count_tokens).

Content blocks arrive as objects and are read one by one (choir/app/serving/messages.py), so that a block
Choir cannot serve is refused by its place and type (`messages[2].content[1]`: `document` blocks are
not served) rather than by a union's generic error.
"""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

Block = dict[str, Any]


class SystemText(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class InputMessage(msgspec.Struct, kw_only=True):
    # user and assistant; `system` turns inside the conversation, as Claude Code sends them
    role: str
    content: str | list[Block]


class AnthropicTool(msgspec.Struct, kw_only=True):
    """A client tool (`type` absent or "custom"); any other type is one of Anthropic's own (server) tools."""

    name: Annotated[str, Meta(min_length=1)]
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None
    strict: bool | None = None


class ToolChoiceAuto(msgspec.Struct, tag_field="type", tag="auto", kw_only=True):
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(msgspec.Struct, tag_field="type", tag="any", kw_only=True):
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(msgspec.Struct, tag_field="type", tag="tool", kw_only=True):
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(msgspec.Struct, tag_field="type", tag="none"):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingConfig(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Meta(ge=1)] | None = None  # `enabled` only: the reasoning's most tokens
    display: str | None = None  # summarized or omitted: every thought is shown in full


class JsonOutputFormat(msgspec.Struct, tag_field="type", tag="json_schema"):
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, kw_only=True):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class Metadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None


class MessagesInput(msgspec.Struct, kw_only=True):
    """What a request to answer and a request to count share: the conversation and what shapes its prompt."""

    model: str
    messages: list[InputMessage]
    system: str | list[SystemText] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    # Hints for Anthropic's own service, accepted and ignored: prompt caching here is the engine's
    # automatic prefix cache, and there is no tiering, no context editing, no region.
    cache_control: Any = None
    context_management: Any = None
    service_tier: str | None = None
    speed: str | None = None
    inference_geo: str | None = None
    diagnostics: Any = None


class MessagesRequest(MessagesInput, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1)]
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    stop_sequences: list[Annotated[str, Meta(min_length=1)]] | None = None
    metadata: Metadata | None = None
    # Refused unless empty: there is no code-execution container and no MCP client here.
    container: Any = None
    mcp_servers: list[Any] | None = None


class CountTokensRequest(MessagesInput, kw_only=True):
    pass


class CountTokensResponse(msgspec.Struct):
    input_tokens: int


# The answer

class TextOutput(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ThinkingOutput(msgspec.Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str


class ToolUseOutput(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = TextOutput | ThinkingOutput | ToolUseOutput
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"]


class MessageUsage(msgspec.Struct, kw_only=True):
    input_tokens: int  # the prompt's tokens that were not read from the prefix cache
    output_tokens: int
    cache_creation_input_tokens: int | None = 0
    cache_read_input_tokens: int | None = 0


class Message(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class DeltaUsage(msgspec.Struct, kw_only=True):
    output_tokens: int
    input_tokens: int | UnsetType = UNSET
    cache_creation_input_tokens: int | None | UnsetType = UNSET
    cache_read_input_tokens: int | None | UnsetType = UNSET


class MessageEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One stream event (its SSE name is its `type`): message_start, content_block_start, content_block_delta,
    content_block_stop, message_delta, message_stop, ping, or error."""

    type: str
    message: Message | UnsetType = UNSET  # message_start
    index: int | UnsetType = UNSET  # the content block's
    content_block: ContentBlock | UnsetType = UNSET  # content_block_start
    # content_block_delta's (typed by its `type`), or message_delta's: {stop_reason, stop_sequence}
    delta: dict[str, Any] | UnsetType = UNSET
    usage: DeltaUsage | UnsetType = UNSET  # message_delta


class AnthropicErrorDetail(msgspec.Struct):
    type: str
    message: str


class AnthropicError(msgspec.Struct, tag_field="type", tag="error"):
    error: AnthropicErrorDetail
    request_id: str | None = None
