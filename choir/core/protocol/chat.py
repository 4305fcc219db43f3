"""/v1/chat/completions wire types."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from choir.core.protocol.common import FinishReason, MaxTokens, PromptLogprobs, SamplingFields, Usage


class TextPart(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ImageURL(msgspec.Struct, kw_only=True):
    url: str  # a data URL (data:image/png;base64,...), or an http(s) URL on a host the server fetches from
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the model's processor decides the resolution


class ImagePart(msgspec.Struct, tag_field="type", tag="image_url"):
    """An image, for a vision-language model (choir/plugins/media.py checks it; vLLM's renderer loads it)."""

    image_url: ImageURL


# OpenAI's `wav` or `mp3`; any container the server reads is taken (choir/plugins/audio.py). vLLM writes it into a
# data URL's media type: a word.
AudioFormat = Annotated[str, Meta(pattern=r"^[A-Za-z0-9.+-]{1,16}$")]


class InputAudio(msgspec.Struct, kw_only=True):
    data: str  # base64 of the file
    format: AudioFormat


class InputAudioPart(msgspec.Struct, tag_field="type", tag="input_audio"):
    """Audio, for an audio-language model (choir/plugins/audio.py checks it; vLLM's renderer decodes it)."""

    input_audio: InputAudio


class AudioURL(msgspec.Struct, kw_only=True):
    url: str  # a data URL: data:audio/wav;base64,...


class AudioURLPart(msgspec.Struct, tag_field="type", tag="audio_url"):
    """vLLM's other spelling of an audio part: a data URL."""

    audio_url: AudioURL


ContentPart = TextPart | ImagePart | InputAudioPart | AudioURLPart
AUDIO_PARTS = ("input_audio", "audio_url")  # the `type` of a chat message's audio parts


class ChatMessage(msgspec.Struct, kw_only=True):
    # OpenAI's roles: system, developer, user, assistant, tool. Others are the compat profile's call
    # (`message_roles`): refused, or handed to the chat template as they are (vLLM).
    role: Annotated[str, Meta(min_length=1)]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list["ToolCall"] | None = None  # an assistant turn that called tools
    reasoning: str | None = None  # an assistant turn's reasoning, for templates that show it
    reasoning_content: str | None = None  # the older name of `reasoning`


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: NamedFunction


class TextFormat(msgspec.Struct, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(msgspec.Struct, tag_field="type", tag="json_object"):
    pass


class JsonSchema(msgspec.Struct, kw_only=True):
    name: str = "response"
    schema: dict[str, Any] | None = None  # required; a missing one gets a 400 that says so
    strict: bool | None = None
    description: str | None = None


class JsonSchemaFormat(msgspec.Struct, tag_field="type", tag="json_schema", kw_only=True):
    json_schema: JsonSchema


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    # -1: every token of the vocabulary (vLLM's); the engine's --max-logprobs bounds it (default 20)
    top_logprobs: Annotated[int, Meta(ge=-1)] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # vLLM's chat extras
    reasoning_effort: ReasoningEffort | None = None  # a chat template kwarg; "none" also sets enable_thinking false
    include_reasoning: bool = True  # false: the reasoning is generated, counted and dropped
    documents: list[dict[str, str]] | None = None  # for chat templates that take documents (RAG)
    # vLLM chat fields Choir does not serve: accepted at their defaults, refused otherwise
    echo: bool = False
    chat_template: str | None = None
    media_io_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    return_prompt_text: bool | None = None
    # SGLang's chat extras (`sglang_fields` in choir/spec/profiles)
    separate_reasoning: bool = True  # false: the reasoning stays in the content
    stream_reasoning: bool = True  # false: streamed reasoning comes in one delta, once it ends
    # ... not served: accepted at their defaults, refused otherwise
    input_ids: list[int] | None = None
    return_prompt_token_ids: bool = False
    return_meta_info: bool = False
    max_dynamic_patch: int | None = None
    min_dynamic_patch: int | None = None


class BatchChatCompletionRequest(ChatCompletionRequest, kw_only=True):
    """vLLM's batched chat (POST /v1/chat/completions/batch): a list of conversations, each answered by one
    choice whose `index` is the conversation's; every other field applies to each conversation."""

    messages: Annotated[list[Annotated[list[ChatMessage], Meta(min_length=1)]], Meta(min_length=1)]  # type: ignore[assignment]


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[TokenLogprob]


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str  # JSON text


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"  # the server's --response-role, "assistant" unless set
    content: str | None
    reasoning_content: str | None | UnsetType = UNSET  # the compat profile names the reasoning field
    reasoning: str | None | UnsetType = UNSET
    tool_calls: list[ToolCall] | UnsetType = UNSET


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None | UnsetType = UNSET  # with `return_token_ids` (null: the profile's null_fields)


class ChatCompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | UnsetType = UNSET  # sent only where the compat profile says so
    prompt_token_ids: list[int] | None | UnsetType = UNSET  # with `return_token_ids`
    prompt_logprobs: PromptLogprobs | None | UnsetType = UNSET  # with `prompt_logprobs`


class DeltaFunctionCall(msgspec.Struct, omit_defaults=True):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class DeltaToolCall(msgspec.Struct, omit_defaults=True):
    """The first delta of a call has its id, type and name; later ones add argument text."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: DeltaFunctionCall | UnsetType = UNSET


class Delta(msgspec.Struct, omit_defaults=True):
    """Only the keys that are set are sent; the compat profile's `delta_always` keys always are."""

    role: str | UnsetType = UNSET
    content: str | None | UnsetType = UNSET
    reasoning_content: str | None | UnsetType = UNSET
    reasoning: str | None | UnsetType = UNSET
    tool_calls: list[DeltaToolCall] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None
    token_ids: list[int] | None | UnsetType = UNSET  # with `return_token_ids`: this chunk's tokens


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | UnsetType = UNSET
    prompt_token_ids: list[int] | None | UnsetType = UNSET  # with `return_token_ids`: on each choice's first chunk
