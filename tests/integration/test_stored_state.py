"""What the server remembers, through the OpenAI SDK's own calls and the Agents SDK on the real engine:
background responses (polled, streamed again from an event, cancelled) and the Conversations API (a
response that continues a conversation adds its turn to it; the Agents SDK's conversation-backed runs)."""

import asyncio
import json
import time

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.engine

SMALL = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 8}}, "required": ["word"],
         "additionalProperties": False}
BOUNDED = {"format": {"type": "json_schema", "name": "w", "schema": SMALL}}  # the random model completes it


def wait_for(client, response_id, statuses=("completed", "incomplete", "failed", "cancelled")):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        response = client.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        time.sleep(0.1)
    raise AssertionError(f"{response_id} stayed {response.status}")


def test_a_background_response_is_polled_to_its_end(client, model):
    queued = client.responses.create(model=model, input="Say a word.", background=True, max_output_tokens=200,
                                     text=BOUNDED)
    assert queued.status == "queued" and queued.background is True
    done = wait_for(client, queued.id)
    assert done.status == "completed" and done.background is True
    jsonschema.validate(json.loads(done.output_text), SMALL)


def test_a_background_stream_is_resumed_after_an_event(client, model):
    events = list(client.responses.create(model=model, input="Say a word.", background=True, stream=True,
                                          max_output_tokens=200, text=BOUNDED))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    response_id = events[0].response.id
    resumed = list(client.responses.retrieve(response_id, stream=True, starting_after=3))
    assert [event.model_dump() for event in resumed] == [event.model_dump() for event in events[4:]]
    with client.responses.stream(response_id=response_id, starting_after=3) as stream:  # the SDK's resume helper
        final = stream.get_final_response()
    assert final.output_text == events[-1].response.output_text


def test_a_background_response_is_cancelled(client, model):
    long = client.responses.create(model=model, input="Tell me everything.", background=True,
                                   max_output_tokens=1500)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status in ("cancelled", "completed", "incomplete")  # the cancel won, or the end was first
    assert cancelled.status == "cancelled"  # 1500 tokens take far longer than one round trip
    assert client.responses.retrieve(long.id).status == "cancelled"
    assert client.responses.cancel(long.id).status == "cancelled"  # idempotent
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(client.responses.create(model=model, input="x", max_output_tokens=2).id)


def test_conversations_through_the_sdk(client, model):
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Hello"}],
                                               metadata={"topic": "demo"})
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "demo"}
    assert client.conversations.retrieve(conversation.id).id == conversation.id
    assert client.conversations.update(conversation.id, metadata={"topic": "other"}).metadata == {"topic": "other"}
    first = client.responses.create(model=model, input="And now?", conversation=conversation.id, max_output_tokens=3)
    second = client.responses.create(model=model, input="Again.", conversation={"id": conversation.id},
                                     max_output_tokens=3)
    assert first.conversation.id == second.conversation.id == conversation.id
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn came along
    added = client.conversations.items.create(conversation.id, items=[{"type": "message", "role": "user",
                                                                       "content": "Last."}])
    items = list(client.conversations.items.list(conversation.id, order="asc", limit=2))  # pages by last_id
    assert [item.role for item in items] == ["user", "user", "assistant", "user", "assistant", "user"]
    assert items[2].id == first.output[0].id and items[-1].id == added.data[0].id
    assert client.conversations.items.retrieve(items[0].id, conversation_id=conversation.id).id == items[0].id
    assert client.conversations.items.delete(items[0].id, conversation_id=conversation.id).id == conversation.id
    assert len(list(client.conversations.items.list(conversation.id))) == 5
    assert client.conversations.delete(conversation.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def _agent(server, model):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, set_tracing_disabled
    from pydantic import BaseModel

    class Verdict(BaseModel):
        ok: bool

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    agent = Agent(name="brief", instructions="Answer briefly.",
                  model=OpenAIResponsesModel(model=model, openai_client=client),
                  model_settings=ModelSettings(max_tokens=64, temperature=0), output_type=Verdict)
    return agent, client, Verdict


def test_agents_sdk_runs_in_a_server_conversation(server, client, model):
    """`conversation_id`: the SDK sends `conversation` on every call and only the new input; the server keeps
    and extends the conversation."""
    from agents import Runner

    agent, _, verdict = _agent(server, model)
    conversation = client.conversations.create()

    async def two_turns() -> None:
        for text in ("Hello there", "And again"):
            result = await Runner.run(agent, text, conversation_id=conversation.id)
            assert isinstance(result.final_output, verdict)

    asyncio.run(two_turns())
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    assert [item.role for item in items] == ["user", "assistant", "user", "assistant"]
    assert items[0].content[0].text == "Hello there" and items[2].content[0].text == "And again"


def test_agents_sdk_conversations_session(server, client, model):
    """OpenAIConversationsSession keeps the history in a conversation and sends it back as input items (with
    the ids and statuses the server gave them)."""
    from agents import OpenAIConversationsSession, Runner

    agent, async_client, verdict = _agent(server, model)
    session = OpenAIConversationsSession(openai_client=async_client)

    async def two_turns() -> str:
        for text in ("Hello there", "And again"):
            result = await Runner.run(agent, text, session=session)
            assert isinstance(result.final_output, verdict)
        return await session._get_session_id()

    conversation_id = asyncio.run(two_turns())
    items = list(client.conversations.items.list(conversation_id, order="asc"))
    assert [item.role for item in items] == ["user", "assistant", "user", "assistant"]
