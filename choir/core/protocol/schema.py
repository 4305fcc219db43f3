"""Keep choir/spec/openapi.yaml's component schemas equal to the wire types (tests/test_spec.py checks it).

    python -m choir.core.protocol.schema     # rewrite the components after changing a Struct
"""

from importlib.resources import files
from pathlib import Path
from typing import Any

import msgspec
import yaml

from choir.core.protocol.audio import TranscriptEvent, Transcription, TranscriptionUpload, TranscriptionVerbose
from choir.core.protocol.batches import Batch, BatchCreateRequest, BatchList
from choir.core.protocol.chat import (
    BatchChatCompletionRequest,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from choir.core.protocol.common import ErrorResponse
from choir.core.protocol.completions import CompletionChunk, CompletionRequest, CompletionResponse
from choir.core.protocol.conversations import (
    Conversation,
    ConversationCreateRequest,
    ConversationItemsRequest,
    ConversationUpdateRequest,
    DeletedConversation,
)
from choir.core.protocol.embeddings import EmbeddingRequest, EmbeddingResponse
from choir.core.protocol.files import DeletedFile, FileList, OpenAIFile
from choir.core.protocol.messages import (
    AnthropicError,
    CountTokensRequest,
    CountTokensResponse,
    Message,
    MessageEvent,
    MessagesRequest,
)
from choir.core.protocol.models import LoadLoraAdapterRequest, ModelList, UnloadLoraAdapterRequest
from choir.core.protocol.operator import CollectiveRpcRequest
from choir.core.protocol.pooling import (
    ClassificationRequest,
    ClassificationResponse,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from choir.core.protocol.responses import DeletedResponse, Response, ResponseEvent, ResponseItemList, ResponsesRequest
from choir.core.protocol.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse

WIRE_TYPES = [CompletionRequest, CompletionResponse, CompletionChunk, ChatCompletionRequest, ChatCompletionResponse,
              ChatCompletionChunk, BatchChatCompletionRequest, ModelList, ErrorResponse, ResponsesRequest, Response,
              ResponseEvent, ResponseItemList, DeletedResponse, TokenizeRequest, TokenizeResponse, DetokenizeRequest,
              DetokenizeResponse, EmbeddingRequest, EmbeddingResponse, RerankRequest, RerankResponse, ScoreRequest,
              ScoreResponse, ClassificationRequest, ClassificationResponse, LoadLoraAdapterRequest,
              UnloadLoraAdapterRequest, ConversationCreateRequest, ConversationUpdateRequest,
              ConversationItemsRequest, Conversation, DeletedConversation, MessagesRequest, Message, MessageEvent,
              CountTokensRequest, CountTokensResponse, AnthropicError, CollectiveRpcRequest, OpenAIFile, FileList,
              DeletedFile, BatchCreateRequest, Batch, BatchList, TranscriptionUpload, Transcription,
              TranscriptionVerbose, TranscriptEvent]
# The package data file itself (a checkout's, installed editable, when this is run as a script to update it).
SPEC_FILE = Path(str(files("choir") / "spec" / "openapi.yaml"))


def component_schemas() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(WIRE_TYPES, ref_template="#/components/schemas/{name}")
    return msgspec.json.decode(msgspec.json.encode(components))


SCHEMAS_MARK = "\n  schemas:\n"  # components.schemas: the generated part, last in the file


def write_components(path: Path = SPEC_FILE) -> None:
    """Replace the generated tail of the file; the hand-written part above it keeps its layout."""
    text = path.read_text()
    head = text[: text.index(SCHEMAS_MARK) + len(SCHEMAS_MARK)]
    body = yaml.safe_dump(component_schemas(), sort_keys=False, width=110, allow_unicode=True)
    path.write_text(head + "".join(f"    {line}\n" for line in body.splitlines()))
    yaml.safe_load(path.read_text())  # still one valid document


if __name__ == "__main__":
    write_components()
    print(f"updated the component schemas of {SPEC_FILE}")
