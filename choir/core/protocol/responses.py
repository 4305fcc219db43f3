"""/v1/responses wire types: the OpenAI Responses API, the part Choir serves."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from choir.core.protocol.chat import AudioFormat, JsonObjectFormat, JsonSchema, TextFormat, TokenLogprob


class InputText(msgspec.Struct, tag_field="type", tag="input_text"):
    text: str


class OutputTextInput(msgspec.Struct, tag_field="type", tag="output_text"):
    """Assistant text from earlier turns, sent back as input."""

    text: str


class InputImage(msgspec.Struct, tag_field="type", tag="input_image", kw_only=True):
    """An image, for a vision-language model: a data URL or an http(s) URL (`file_id` needs a Files API, which
    this server has not)."""

    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high", "original"] | None = "auto"


class InputAudioData(msgspec.Struct, kw_only=True):
    data: str  # base64 of the file
    format: AudioFormat  # `wav`, `mp3`, ...: a word


class InputAudio(msgspec.Struct, tag_field="type", tag="input_audio", kw_only=True):
    """Audio, for an audio-language model."""

    input_audio: InputAudioData


class InputMessage(msgspec.Struct, kw_only=True):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText | OutputTextInput | InputImage | InputAudio]


class FunctionCallInput(msgspec.Struct, kw_only=True):
    """A call the model made in an earlier turn (`namespace`: the namespace tool its function is in)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None
    id: str | None = None
    status: str | None = None


ToolOutputPart = InputText | InputImage


class FunctionCallOutputInput(msgspec.Struct, kw_only=True):
    """The result of such a call: text, or parts (text and images)."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ToolOutputPart]
    id: str | None = None
    status: str | None = None


class CustomToolCallInput(msgspec.Struct, kw_only=True):
    """A call of a custom (freeform) tool the model made in an earlier turn: its input is text."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    namespace: str | None = None
    id: str | None = None
    status: str | None = None


class CustomToolCallOutputInput(msgspec.Struct, kw_only=True):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[ToolOutputPart]
    name: str | None = None
    id: str | None = None
    status: str | None = None


class LocalShellAction(msgspec.Struct, kw_only=True):
    type: Literal["exec"] = "exec"
    command: list[str]
    timeout_ms: int | None = None
    working_directory: str | None = None
    env: dict[str, str] | None = None
    user: str | None = None


class LocalShellCallInput(msgspec.Struct, kw_only=True):
    """A call of the built-in local shell tool from an earlier turn (a client that runs it sends it back)."""

    type: Literal["local_shell_call"]
    call_id: str | None = None
    id: str | None = None
    action: LocalShellAction
    status: str | None = None


class LocalShellCallOutputInput(msgspec.Struct, kw_only=True):
    type: Literal["local_shell_call_output"]
    id: str  # the call's
    output: str
    status: str | None = None


class ReasoningText(msgspec.Struct, tag_field="type", tag="reasoning_text"):
    text: str


class SummaryText(msgspec.Struct, tag_field="type", tag="summary_text"):
    text: str


class ReasoningInput(msgspec.Struct, kw_only=True):
    """Reasoning from an earlier turn, sent back: it goes to that turn's assistant message."""

    type: Literal["reasoning"]
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    id: str | None = None
    status: str | None = None
    # Choir's own (given with include ["reasoning.encrypted_content"]) is read back; any other is refused.
    encrypted_content: str | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # echoed; no summaries are written
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the older name of `summary`


ToolName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class FunctionTool(msgspec.Struct, tag_field="type", tag="function", kw_only=True):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomTool(msgspec.Struct, tag_field="type", tag="custom", kw_only=True, omit_defaults=True):
    """A freeform tool: the model calls it with text, not JSON (`format`: {"type": "text"}, or {"type": "grammar",
    "syntax": "lark" | "regex", "definition": ...}, which the model is shown and not held to)."""

    name: ToolName
    description: str | None = None
    format: dict[str, Any] | None = None


class NamespaceTool(msgspec.Struct, tag_field="type", tag="namespace", kw_only=True, omit_defaults=True):
    """Tools grouped under a name: each is offered to the model, and its calls come back with `namespace`."""

    name: ToolName
    description: str | None = None
    tools: list[FunctionTool | CustomTool]


class BuiltInTool(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """One of OpenAI's hosted tools. Choir hosts none of them: the model is not offered it, as OpenAI's API does
    with a tool it does not offer, and the request is served without it."""


class WebSearchTool(BuiltInTool, tag="web_search"):
    external_web_access: bool | None = None
    filters: dict[str, Any] | None = None
    user_location: dict[str, Any] | None = None
    search_context_size: str | None = None


class WebSearchPreviewTool(WebSearchTool, tag="web_search_preview"):
    pass


class WebSearchDatedTool(WebSearchTool, tag="web_search_2025_08_26"):
    pass


class WebSearchPreviewDatedTool(WebSearchTool, tag="web_search_preview_2025_03_11"):
    pass


class FileSearchTool(BuiltInTool, tag="file_search"):
    pass


class CodeInterpreterTool(BuiltInTool, tag="code_interpreter"):
    pass


class ComputerUseTool(BuiltInTool, tag="computer_use_preview"):
    pass


class ImageGenerationTool(BuiltInTool, tag="image_generation"):
    pass


class LocalShellTool(BuiltInTool, tag="local_shell"):
    pass


class ShellTool(BuiltInTool, tag="shell"):
    pass


class ApplyPatchTool(BuiltInTool, tag="apply_patch"):
    pass


class McpTool(BuiltInTool, tag="mcp"):
    pass


class ToolSearchTool(BuiltInTool, tag="tool_search"):
    pass


Tool = (FunctionTool | CustomTool | NamespaceTool | WebSearchTool | WebSearchPreviewTool | WebSearchDatedTool
        | WebSearchPreviewDatedTool | FileSearchTool | CodeInterpreterTool | ComputerUseTool | ImageGenerationTool
        | LocalShellTool | ShellTool | ApplyPatchTool | McpTool | ToolSearchTool)


class FunctionToolChoice(msgspec.Struct, kw_only=True):
    """A named function (`namespace`: the namespace tool it is in), or a named custom tool."""

    type: Literal["function", "custom"]
    name: str
    namespace: str | None = None


class JsonSchemaTextFormat(msgspec.Struct, tag_field="type", tag="json_schema", kw_only=True):
    """Responses put the schema's fields beside `type` (chat nests them under `json_schema`)."""

    name: str = "response"
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None

    def as_chat(self) -> JsonSchema:
        return JsonSchema(name=self.name, schema=self.schema, strict=self.strict, description=self.description)


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | JsonObjectFormat | JsonSchemaTextFormat | None = None


class ConversationRef(msgspec.Struct):
    id: str


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    # A string, or a list of items: messages (with `type` "message" or none), function calls and outputs.
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    include_reasoning: bool = True  # vLLM's: false drops the reasoning items (the tokens are still counted)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: what the chat template is given besides input
    # "message.output_text.logprobs" returns each output token's logprob (and `top_logprobs` alternatives);
    # Choir has nothing to add for the other values OpenAI defines, which are accepted.
    include: list[str] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    # OpenAI's default (null) is true: stored unless the server runs with CHOIR_STORE=off (the response says).
    store: bool | None = None
    background: bool = False  # made apart from the request: poll, stream again, or cancel it (needs the store)
    previous_response_id: str | None = None  # a stored response this one continues
    conversation: str | ConversationRef | None = None  # a stored conversation this one continues and adds to
    truncation: Literal["auto", "disabled"] = "disabled"  # auto: the oldest turns dropped to fit the context
    user: str | None = None
    metadata: dict[str, str] | None = None
    # Accepted: a hint that requests sharing it share a prefix (with data-parallel engines, they go to one rank);
    # what a client says of itself; the rest OpenAI's, with nothing here for them to change.
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    max_tool_calls: Annotated[int, Meta(ge=0)] | None = None  # of hosted tools: Choir hosts none

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation


ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class OutputText(msgspec.Struct, tag_field="type", tag="output_text", kw_only=True):
    text: str
    annotations: list[Any] = []
    logprobs: list[TokenLogprob] = []  # with include ["message.output_text.logprobs"]


class DeltaTopLogprob(msgspec.Struct):
    token: str
    logprob: float


class DeltaLogprob(msgspec.Struct):
    """A streamed text delta's token: OpenAI's events carry no `bytes`."""

    token: str
    logprob: float
    top_logprobs: list[DeltaTopLogprob]


class OutputMessage(msgspec.Struct, tag_field="type", tag="message", kw_only=True):
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallOutput(msgspec.Struct, tag_field="type", tag="function_call", kw_only=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus
    namespace: str | UnsetType = UNSET  # the namespace tool the function is in


class CustomToolCallOutput(msgspec.Struct, tag_field="type", tag="custom_tool_call", kw_only=True):
    id: str
    call_id: str
    name: str
    input: str
    status: ItemStatus
    namespace: str | UnsetType = UNSET


class ReasoningOutput(msgspec.Struct, tag_field="type", tag="reasoning", kw_only=True):
    id: str
    status: ItemStatus
    summary: list[SummaryText] = []
    content: list[ReasoningText]
    # With include ["reasoning.encrypted_content"]: the reasoning in a form Choir reads back (not secret: the
    # text is in `content` too), for clients that keep nothing (store: false) and send it back.
    encrypted_content: str | UnsetType = UNSET


OutputItem = OutputMessage | FunctionCallOutput | CustomToolCallOutput | ReasoningOutput


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0  # prompt tokens the prefix cache held


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(msgspec.Struct):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(msgspec.Struct):
    code: str
    message: str


class Response(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool = True
    tool_choice: Any = "auto"
    tools: list[Tool] = []
    top_logprobs: int | None = None
    store: bool = False  # whether it is stored (GET /v1/responses/{id}, previous_response_id)
    background: bool = False
    previous_response_id: str | None = None
    conversation: ConversationRef | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    text: TextConfig | UnsetType = UNSET
    reasoning: ReasoningConfig | UnsetType = UNSET
    metadata: dict[str, str] | UnsetType = UNSET


class ResponseEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One streamed lifecycle event; `type` names it, and only the fields its type has are set."""

    type: str
    sequence_number: int
    response: Response | UnsetType = UNSET
    output_index: int | UnsetType = UNSET
    item: OutputItem | UnsetType = UNSET
    item_id: str | UnsetType = UNSET
    content_index: int | UnsetType = UNSET
    part: OutputText | ReasoningText | UnsetType = UNSET
    delta: str | UnsetType = UNSET
    text: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET
    input: str | UnsetType = UNSET  # response.custom_tool_call_input.done
    logprobs: list[DeltaLogprob] | UnsetType = UNSET


class ResponseItemList(msgspec.Struct, kw_only=True):
    """A page of a stored response's input items (OpenAI's cursor page: `after` an item id)."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
