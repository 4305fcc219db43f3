"""Handlers bound to the spec's operations (see choir/plugins/spec.py), one module per resource."""

from typing import Any

from choir.app.routes.adapters import load_lora_adapter, unload_lora_adapter
from choir.app.routes.audio import AUDIO_HANDLERS
from choir.app.routes.batches import BATCH_HANDLERS
from choir.app.routes.chat import create_batch_chat_completion, create_chat_completion
from choir.app.routes.completions import create_completion
from choir.app.routes.conversations import (
    create_conversation,
    create_conversation_items,
    delete_conversation,
    delete_conversation_item,
    get_conversation,
    get_conversation_item,
    list_conversation_items,
    update_conversation,
)
from choir.app.routes.embeddings import create_embedding
from choir.app.routes.files import FILE_HANDLERS
from choir.app.routes.invocations import invocations
from choir.app.routes.messages import count_message_tokens, create_message
from choir.app.routes.models import list_models, retrieve_model
from choir.app.routes.operator import OPERATOR_HANDLERS
from choir.app.routes.pooling import create_classification, create_rerank, create_score
from choir.app.routes.realtime import REALTIME_HANDLERS
from choir.app.routes.responses import (
    cancel_response,
    create_response,
    delete_response,
    get_response,
    list_input_items,
)
from choir.app.routes.tokenize import create_text, create_tokens

ROUTE_HANDLERS: list[Any] = [
    list_models, retrieve_model, create_completion, create_chat_completion, create_batch_chat_completion,
    create_response, get_response, delete_response, cancel_response, list_input_items, create_conversation,
    get_conversation, update_conversation, delete_conversation, create_conversation_items, list_conversation_items,
    get_conversation_item, delete_conversation_item, create_embedding, create_tokens, create_text, create_rerank,
    create_score, create_classification, load_lora_adapter, unload_lora_adapter, invocations, create_message,
    count_message_tokens, *FILE_HANDLERS, *BATCH_HANDLERS, *AUDIO_HANDLERS, *OPERATOR_HANDLERS, *REALTIME_HANDLERS]
