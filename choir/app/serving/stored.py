"""Responses that are remembered (`store`, OpenAI's default): what a request continues (a
`previous_response_id`'s chain, or a `conversation`'s items), what a stored response keeps, and the reads of
GET /v1/responses/{id} and its input items. The store itself is choir/plugins/store/; without one
(CHOIR_STORE=off) nothing is stored.

A response continues from items, as OpenAI describes it: each earlier turn's input items, then its output
items (text, function calls, reasoning). `instructions` are never carried over: each request sends its own."""

import secrets
from dataclasses import dataclass, field
from typing import Any

import msgspec

from choir.core.errors import APIError, bad_request
from choir.core.protocol.responses import Response, ResponsesRequest
from choir.plugins.store.models import StoredResponse
from choir.plugins.store.responses import MAX_CHAIN, BrokenChain, ChainTooLong, NotContinuable
from choir.plugins.store.store import Store

MAX_ITEM_ID = 256
_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


@dataclass
class Continued:
    """What a request continues: `history` (None: there is no store), the chain of responses it follows, and
    its own input items, each with an id (stored with it, and added to its conversation)."""

    history: list[dict[str, Any]] | None
    turn: list[dict[str, Any]]
    chain: list[str] = field(default_factory=list)


def wants_store(store: Store | None, request: ResponsesRequest) -> bool:
    return store is not None and request.store is not False


async def continued(store: Store | None, owner: str, request: ResponsesRequest) -> Continued:
    turn = input_items(request.input)
    if store is None:
        if request.conversation is not None:
            raise bad_request("conversation needs the store, and this server runs without one (CHOIR_STORE=off).",
                              "conversation")
        return Continued(None, turn)
    if request.conversation_id is not None:
        if request.previous_response_id is not None:
            raise bad_request("previous_response_id and conversation cannot be used together: a response "
                              "continues one or the other.", "previous_response_id")
        if await store.conversations.get(owner, request.conversation_id) is None:
            raise conversation_not_found(request.conversation_id, "conversation")
        return Continued(await store.conversations.items(request.conversation_id), turn)
    if request.previous_response_id is None:
        return Continued([], turn)
    try:
        chain = await store.responses.chain(owner, request.previous_response_id)
    except BrokenChain as broken:
        raise APIError(404, f"The response '{broken.missing}', an earlier turn of the conversation "
                            f"previous_response_id continues, was deleted or has expired: its context is gone. "
                            "Start a new conversation.", "previous_response_id") from None
    except ChainTooLong:
        raise bad_request(f"The conversation previous_response_id continues has more than {MAX_CHAIN} turns: "
                          "start a new one, or keep a long one in a conversation (`conversation`).",
                          "previous_response_id") from None
    except NotContinuable as unfinished:
        raise bad_request(f"The response previous_response_id names is {unfinished.status}: only a completed or "
                          "incomplete response can be continued (wait for a background one to end).",
                          "previous_response_id") from None
    if not chain:
        raise not_found(request.previous_response_id, "previous_response_id")
    history = [item for row in chain for item in (*row.input_items, *row.body["output"])]
    return Continued(history, turn, [row.id for row in chain])


def input_items(given: str | list[dict[str, Any]], param: str = "input") -> list[dict[str, Any]]:
    """Input as OpenAI lists it (GET .../input_items, a conversation's items): items with ids and a status,
    message content as parts."""
    raw = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given
    items = []
    for index, item in enumerate(raw):
        if not isinstance(item.get("id") or "", str) or len(item.get("id") or "") > MAX_ITEM_ID:
            raise bad_request(f"An item id is a string of at most {MAX_ITEM_ID} characters.", f"{param}[{index}].id")
        kind = item.get("type", "message")
        if not isinstance(kind, str):
            raise bad_request(f"An item's type is a string, not {type(kind).__name__}.", f"{param}[{index}].type")
        listed = {**item, "type": kind, "id": item.get("id") or f"{_ITEM_PREFIX.get(kind, 'item')}_"
                                                                 f"{secrets.token_hex(12)}",
                  "status": item.get("status") or "completed"}
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            listed["content"] = [{"type": part, "text": item["content"]}]
        items.append(listed)
    return items


async def stored(store: Store | None, owner: str, response_id: str) -> StoredResponse:
    row = await store.responses.get(owner, response_id) if store is not None else None
    if row is None:
        raise not_found(response_id, "response_id")
    return row


def as_response(row: StoredResponse) -> Response:
    return msgspec.convert(row.body, Response)


def not_found(response_id: str, param: str) -> APIError:
    return APIError(404, f"No response with id '{response_id}' is stored for this API key: responses are stored "
                         "when `store` is not false, until they are deleted or expire (CHOIR_STORE_TTL).", param)


def conversation_not_found(conversation_id: str, param: str) -> APIError:
    return APIError(404, f"No conversation with id '{conversation_id}' is stored for this API key.", param)


async def remember(store: Store, owner: str, request: ResponsesRequest, response: Response,
                   context: Continued) -> None:
    """A response that ended (not in the background: its run stores it, choir/app/serving/background.py): stored
    unless `store` is false, and its turn added to its conversation, if it has one."""
    body = msgspec.to_builtins(response)
    if request.store is not False:
        await store.responses.save(owner, body, context.turn, context.chain)
    if request.conversation_id is not None:
        await store.conversations.add(request.conversation_id, [*context.turn, *body["output"]])
