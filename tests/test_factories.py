"""Many generated requests, valid by the wire types' own constraints: none may produce a 5xx."""

import msgspec
from polyfactory import Use
from polyfactory.factories.msgspec_factory import MsgspecFactory

from choir.app.serving.unserved import CHAT_UNSERVED, UNSERVED
from choir.core.compat import OPENAI_ROLES
from choir.core.protocol.chat import ChatCompletionRequest, ChatMessage
from choir.core.protocol.completions import CompletionRequest

# Fields that are refused unless left at their default (or that a random value almost always makes
# invalid together with others) are pinned, so that generated requests do reach the engine too.
PINNED = {**{name: default for name, (default, _) in UNSERVED.items()}, "structured_outputs": None, "priority": 0,
          "best_of": None, "truncation_side": None, "logprob_token_ids": None, "prompt_logprobs": None,
          "regex": None, "ebnf": None, "lora_path": None}  # SGLang's constraints and adapter names: 400s at random
COMPLETION_PINNED = {**PINNED, "json_schema": None}
CHAT_PINNED = {**{k: v for k, v in PINNED.items() if k != "prompt_embeds"},
               **{name: default for name, (default, _) in CHAT_UNSERVED.items()}}


class CompletionRequestFactory(MsgspecFactory[CompletionRequest]):
    __allow_none_optionals__ = True


class ChatMessageFactory(MsgspecFactory[ChatMessage]):
    __set_as_default_factory_for_type__ = True
    __allow_none_optionals__ = True
    role = Use(lambda: ChatMessageFactory.__random__.choice(OPENAI_ROLES))  # others are a 400 (sglang profile)


class ChatRequestFactory(MsgspecFactory[ChatCompletionRequest]):
    __allow_none_optionals__ = True


def check(response) -> int:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    return response.status_code


def test_generated_completion_requests_never_fail_with_5xx(client):
    CompletionRequestFactory.seed_random(1)
    statuses = []
    for _ in range(150):
        body = msgspec.to_builtins(CompletionRequestFactory.build(**COMPLETION_PINNED))
        body.pop("model", None)
        statuses.append(check(client.post("/v1/completions", json=body)))
    assert 200 in statuses  # the generator does reach the engine


def test_generated_chat_requests_never_fail_with_5xx(client):
    ChatRequestFactory.seed_random(2)
    statuses = []
    for _ in range(150):
        body = msgspec.to_builtins(ChatRequestFactory.build(tools=None, tool_choice=None, response_format=None,
                                                           **CHAT_PINNED))
        body.pop("model", None)
        statuses.append(check(client.post("/v1/chat/completions", json=body)))
    assert 200 in statuses
