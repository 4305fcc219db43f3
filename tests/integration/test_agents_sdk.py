"""The OpenAI Agents SDK against Choir's Responses API on the real engine: a multi-turn run whose second
turn continues the first by `previous_response_id` (the server keeps the conversation, the client sends only
the new input), as agent frameworks chain calls."""

import asyncio

import openai
import pytest

pytestmark = pytest.mark.engine


def test_a_second_run_continues_the_first_by_previous_response_id(server, model):
    """The answer is a small JSON object (the agent's output type: a schema the engine enforces), so the random
    model ends each turn itself, as an agent's turn must (an incomplete one is an error to the SDK)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
    from pydantic import BaseModel

    class Verdict(BaseModel):
        ok: bool

    set_tracing_disabled(True)  # no traces leave the machine
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    agent = Agent(name="brief", instructions="Answer briefly.",
                  model=OpenAIResponsesModel(model=model, openai_client=client),
                  model_settings=ModelSettings(max_tokens=64, temperature=0), output_type=Verdict)

    async def two_turns() -> tuple[str, str]:
        first = await Runner.run(agent, "Hello there")
        second = await Runner.run(agent, "And again", previous_response_id=first.last_response_id)
        assert isinstance(first.final_output, Verdict) and isinstance(second.final_output, Verdict)
        return first.last_response_id, second.last_response_id

    first_id, second_id = asyncio.run(two_turns())
    assert first_id and second_id and first_id != second_id
    sync = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    first, second = sync.responses.retrieve(first_id), sync.responses.retrieve(second_id)
    assert second.previous_response_id == first_id and second.store is True
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn came along, server-side
    assert [item.content[0].text for item in sync.responses.input_items.list(second_id)] == ["And again"]
