"""Reasoning as vLLM's server reads it, over a scripted fake engine with the bundled tokenizer: the
parser sees the chat template kwargs (Qwen3's enable_thinking), a prompt that closed the reasoning
leaves only content, include_reasoning false drops it, a forced tool's call follows the reasoning,
and the engine is told what its structured outputs need to constrain only what follows it."""

import json

import pytest

from tests.sse import sse_json
from tests.test_parsers_routes import MESSAGES, THOUGHT, assemble, script, token_pieces, use_parsers

CHAT = "/v1/chat/completions"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def whole_and_streamed(client, body):
    whole = client.post(CHAT, json=body).json()
    chunks, done = sse_json(client.post(CHAT, json={**body, "stream": True}).text)
    assert done == 1, chunks
    return whole["choices"][0]["message"], assemble(chunks)


def test_qwen3_with_thinking_off_answers_in_content(client, fake_engine):
    use_parsers(client, fake_engine, reasoning="qwen3")
    fake_engine.script = script(*token_pieces("No thinking here."))
    off = {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}
    message, streamed = whole_and_streamed(client, off)
    assert message["content"] == "No thinking here." and message["reasoning_content"] is None
    assert streamed["content"] == "No thinking here." and streamed["reasoning"] == ""
    on, _ = whole_and_streamed(client, {"messages": MESSAGES})  # Qwen3 thinks by default: no end, all reasoning
    assert on["reasoning_content"] == "No thinking here." and on["content"] is None


def test_reasoning_effort_none_turns_qwen3_thinking_off(client, fake_engine):
    use_parsers(client, fake_engine, reasoning="qwen3")
    fake_engine.script = script(*token_pieces("Plain."))
    message, _ = whole_and_streamed(client, {"messages": MESSAGES, "reasoning_effort": "none"})
    assert message["content"] == "Plain."


def test_a_prompt_that_ended_the_reasoning_leaves_content(client, fake_engine):
    """deepseek_r1 reads text without an end marker as reasoning, unless the prompt already closed it."""
    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    fake_engine.script = script(*token_pieces("The answer."))
    closed = [*MESSAGES, {"role": "assistant", "content": "<think>thought</think>"}]
    body = {"messages": closed, "add_generation_prompt": False, "continue_final_message": True}
    message, streamed = whole_and_streamed(client, body)
    assert message["content"] == streamed["content"] == "The answer." and not message["reasoning_content"]


def test_include_reasoning_false_drops_it_but_counts_it(client, fake_engine):
    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    fake_engine.script = script(*token_pieces(THOUGHT + "Visible."))
    body = {"messages": MESSAGES, "include_reasoning": False, "logprobs": True, "return_token_ids": True}
    whole = client.post(CHAT, json=body).json()
    [choice] = whole["choices"]
    assert choice["message"]["content"] == "Visible." and choice["message"]["reasoning_content"] is None
    assert choice["logprobs"] is None and "token_ids" not in choice  # they would show the reasoning
    assert whole["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    chunks, _ = sse_json(client.post(CHAT, json={**body, "stream": True}).text)
    streamed = assemble(chunks)
    assert streamed["content"] == "Visible." and streamed["reasoning"] == ""
    assert all(c["choices"][0].get("logprobs") is None and "token_ids" not in c["choices"][0] for c in chunks)


@pytest.mark.parametrize("cut", range(1, 12))
def test_a_forced_tool_call_follows_the_reasoning(client, fake_engine, cut):
    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    pieces = token_pieces(THOUGHT + '{"city": "Paris"}')
    fake_engine.script = script("".join(pieces[:cut]), "".join(pieces[cut:]))
    message, streamed = whole_and_streamed(client, {"messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED})
    [call] = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"} and message["content"] == ""
    assert message["reasoning_content"] == streamed["reasoning"] == "The user wants weather."
    [streamed_call] = streamed["calls"].values()
    assert streamed_call["name"] == "get_weather" and json.loads(streamed_call["arguments"]) == {"city": "Paris"}


def test_required_calls_follow_the_reasoning(client, fake_engine):
    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    fake_engine.script = script(*token_pieces(THOUGHT + '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'))
    message, streamed = whole_and_streamed(client, {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"})
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [{"city": "Oslo"}]
    assert [json.loads(c["arguments"]) for c in streamed["calls"].values()] == [{"city": "Oslo"}]
    assert streamed["reasoning"] == "The user wants weather."


def test_the_engine_learns_where_the_constraint_starts(client, fake_engine):
    use_parsers(client, fake_engine, reasoning="qwen3")
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": WEATHER}}
    kwargs = {"enable_thinking": True, "x": 1}
    client.post(CHAT, json={"messages": MESSAGES, "response_format": schema, "chat_template_kwargs": kwargs})
    options = fake_engine.calls[-1].options
    assert options.reasoning_ended is False  # the model reasons first: the engine waits for the end
    assert options.reasoning_parser_kwargs["chat_template_kwargs"]["x"] == 1
    client.post(CHAT, json={"messages": MESSAGES, "response_format": schema, "include_reasoning": False})
    assert fake_engine.calls[-1].options.reasoning_ended is True  # no reasoning wanted: constrain from the start
    client.post(CHAT, json={"messages": MESSAGES})
    assert fake_engine.calls[-1].options.reasoning_ended is None  # unconstrained: nothing to tell


def test_an_output_constrained_from_its_first_token_is_content(client, fake_engine):
    """include_reasoning false with a schema: the engine constrains from token 0, so Qwen3's parser
    (thinking on, which would call text without `</think>` reasoning) must read it all as content."""
    use_parsers(client, fake_engine, reasoning="qwen3")
    fake_engine.script = script(*token_pieces('{"city": "Rome"}'))
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": WEATHER}}
    message, streamed = whole_and_streamed(client, {"messages": MESSAGES, "response_format": schema,
                                                    "include_reasoning": False})
    assert json.loads(message["content"]) == json.loads(streamed["content"]) == {"city": "Rome"}
