"""Responses that are remembered (`store`, OpenAI's default): what a stored response keeps and how a later
request continues it (`previous_response_id`), and the reads of GET /v1/responses/{id}, its input items and
DELETE. The store itself is plugins/store/; without one (CHOIR_STORE=off) nothing is stored.

A stored response keeps the conversation it ends as chat messages: the one it continued, this turn's input,
then its output (its text and its function calls; reasoning is not carried, as vLLM's server does not
carry it). `instructions` are never carried over (OpenAI's rule): each request sends its own."""

import secrets
from typing import Any

import msgspec

from core.errors import APIError
from core.protocol.responses import (
    FunctionCallOutput,
    OutputMessage,
    ReasoningOutput,
    Response,
    ResponsesRequest,
)
from plugins.store.models import StoredResponse
from plugins.store.responses import ResponseStore

_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def wants_store(store: "ResponseStore | None", request: ResponsesRequest) -> bool:
    return store is not None and request.store is not False


def input_items(request: ResponsesRequest) -> list[dict[str, Any]]:
    """This turn's input as OpenAI lists it (GET .../input_items): items with ids, message content as parts."""
    raw = [{"type": "message", "role": "user", "content": request.input}] if isinstance(request.input, str) \
        else request.input
    items = []
    for item in raw:
        kind = item.get("type", "message")
        listed = {**item, "type": kind, "id": item.get("id") or f"{_ITEM_PREFIX.get(kind, 'item')}_"
                                                                 f"{secrets.token_hex(12)}"}
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            listed["content"] = [{"type": part, "text": item["content"]}]
        items.append(listed)
    return items


def conversation_after(before: list[dict[str, Any]], turn: list[dict[str, Any]],
                       response: Response) -> list[dict[str, Any]]:
    """The chat messages a response ends: those it continued, this turn's input (every item: only
    `instructions` are not carried, and they never were messages), then its output: text, function calls and
    the reasoning before them, as the assistant turn a client would send back."""
    text = "".join(part.text for item in response.output if isinstance(item, OutputMessage) for part in item.content)
    calls = [{"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
             for item in response.output if isinstance(item, FunctionCallOutput)]
    reasoning = "".join(part.text for item in response.output if isinstance(item, ReasoningOutput)
                        for part in item.content)
    answer: dict[str, Any] = {"role": "assistant", "content": text or ("" if reasoning and not calls else None)}
    if calls:
        answer["tool_calls"] = calls
    if reasoning:
        answer["reasoning"] = reasoning
    return [*before, *turn, *([answer] if text or calls or reasoning else [])]


async def continued(store: "ResponseStore", owner: str, response_id: str) -> list[dict[str, Any]]:
    """The conversation a `previous_response_id` names (404 if it is not this key's, or gone)."""
    row = await store.get(owner, response_id)
    if row is None:
        raise _not_found(response_id, "previous_response_id")
    return list(row.conversation)


async def stored(store: "ResponseStore | None", owner: str, response_id: str) -> "StoredResponse":
    row = await store.get(owner, response_id) if store is not None else None
    if row is None:
        raise _not_found(response_id, "response_id")
    return row


def as_response(row: "StoredResponse") -> Response:
    return msgspec.convert(row.body, Response)


def _not_found(response_id: str, param: str) -> APIError:
    return APIError(404, f"No response with id '{response_id}' is stored for this API key: responses are stored "
                         "when `store` is not false, until they are deleted or expire (CHOIR_STORE_TTL).", param)


async def remember(store: "ResponseStore", owner: str, request: ResponsesRequest, response: Response,
                   history: list[dict[str, Any]] | None) -> None:
    from app.serving.responses import turn_messages

    await store.save(owner, msgspec.to_builtins(response), input_items(request),
                     conversation_after(history or [], turn_messages(request), response))
