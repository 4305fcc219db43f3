"""The Messages API on the real engine through the official anthropic SDK (2.16: the key as a Bearer token,
its own `anthropic-version`): messages.create, messages.stream and its accumulating helpers, a tool round trip,
thinking through vLLM's qwen3 reasoning parser with a thinking budget, count_tokens, and errors as the SDK's own
exception classes. The server has a key, the hermes tool parser (tools with tool_choice auto) and qwen3."""

import json

import anthropic
import httpx
import jsonschema
import pytest

from tests.integration.server import start_server

pytestmark = pytest.mark.engine
KEY = "anthropic-test-key"
MODEL = "choir-tiny"
HI = [{"role": "user", "content": "Hello there!"}]
NO_THINKING = {"type": "disabled"}  # Qwen3 (the parser) thinks unless told not to
GREEDY = {"temperature": 0.0}  # 2.16 sends sampling fields only through extra_body
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER}]


@pytest.fixture(scope="module")
def anthropic_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("anthropic") / "server.log",
                          env={"CHOIR_API_KEY": KEY, "CHOIR_REASONING_PARSER": "qwen3", "CHOIR_TOOL_PARSER": "hermes"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sdk(anthropic_server):
    return anthropic.Anthropic(base_url=anthropic_server.base_url, api_key=KEY, max_retries=0, timeout=120)


def create(sdk, **kwargs):
    return sdk.messages.create(**{"model": MODEL, "max_tokens": 24, "messages": HI, "thinking": NO_THINKING,
                                  "extra_body": GREEDY, **kwargs})


def test_create_answers_a_message(sdk):
    message = create(sdk, system="You are terse.", metadata={"user_id": "u1"})
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_") and message._request_id == message.id
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert 0 < message.usage.output_tokens <= 24
    counted = sdk.messages.count_tokens(model=MODEL, messages=HI, system="You are terse.", thinking=NO_THINKING)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_stream_helpers_accumulate_what_create_answers(sdk):
    whole = create(sdk)
    with sdk.messages.stream(model=MODEL, max_tokens=24, messages=HI, thinking=NO_THINKING,
                             extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == whole.content[0].text  # greedy: the same tokens
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_the_raw_event_sequence(anthropic_server):
    """Every event named by its type, in Anthropic's order, over the wire with `x-api-key` (Claude Code's way)."""
    response = httpx.post(f"{anthropic_server.base_url}/v1/messages?beta=true", timeout=120, headers={
        "x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"},
        json={"model": MODEL, "max_tokens": 8, "messages": HI, "stream": True, "thinking": NO_THINKING})
    assert response.status_code == 200 and response.headers["request-id"].startswith("msg_")
    lines = response.text.split("\n")
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [event["type"] for event in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert events[-2]["delta"]["stop_reason"] == "max_tokens" and events[-2]["usage"]["output_tokens"] == 8


def test_a_stop_sequence_ends_the_message(sdk):
    message = create(sdk, max_tokens=60, stop_sequences=[" "])  # the random model writes spaces often
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", " ")
    assert " " not in message.content[0].text


def test_a_tool_round_trip(sdk):
    """A forced call (constrained by the schema), its result sent back, and the answer that follows."""
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = create(sdk, messages=question, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
                  max_tokens=200)
    assert call.stop_reason == "tool_use", call
    [use] = call.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER)
    history = [*question, {"role": "assistant", "content": [block.model_dump() for block in call.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24°C"}]}]
    answer = create(sdk, messages=history, tools=TOOLS)  # tool_choice auto: the hermes parser reads the text
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content
    assert answer.usage.input_tokens > call.usage.input_tokens  # the call and its result are in the prompt


def test_any_tool_streams_its_input_as_json_deltas(sdk):
    with sdk.messages.stream(model=MODEL, max_tokens=200, messages=HI, tools=TOOLS, tool_choice={"type": "any"},
                             thinking=NO_THINKING, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content
    for index, block in enumerate(final.content):  # `any` may call more than once, each a block of its own
        deltas = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.index == index]
        assert block.type == "tool_use" and json.loads("".join(deltas)) == block.input
        jsonschema.validate(block.input, WEATHER)


def test_thinking_is_a_thinking_block_cut_at_its_budget(sdk):
    """Qwen3 thinks until `</think>`, which the random model never writes: vLLM's thinking budget writes it after
    `budget_tokens`, and the answer follows as text."""
    thinking = {"type": "enabled", "budget_tokens": 8}
    message = create(sdk, thinking=thinking, max_tokens=30)
    assert [block.type for block in message.content] == ["thinking", "text"], message
    assert message.content[0].thinking and message.content[0].signature
    with sdk.messages.stream(model=MODEL, max_tokens=30, messages=HI, thinking=thinking,
                             extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == message.content[0].thinking
    assert final.content[0].signature == message.content[0].signature
    # Sent back unchanged in the history, the thinking is accepted
    again = create(sdk, messages=[*HI, {"role": "assistant", "content": [b.model_dump() for b in message.content]},
                                  {"role": "user", "content": "And?"}], thinking=thinking, max_tokens=30)
    assert again.content


def test_errors_are_the_sdks_own_classes(sdk, anthropic_server):
    with pytest.raises(anthropic.NotFoundError) as unknown:
        create(sdk, model="claude-sonnet-4-5")
    assert unknown.value.type == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as image:
        create(sdk, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert image.value.type == "invalid_request_error" and "messages.0.content.0" in image.value.message
    with pytest.raises(anthropic.BadRequestError) as too_long:
        create(sdk, messages=[{"role": "user", "content": "word " * 3000}])
    assert "prompt is too long:" in too_long.value.message
    stranger = anthropic.Anthropic(base_url=anthropic_server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        stranger.messages.create(model=MODEL, max_tokens=5, messages=HI)
    assert denied.value.type == "authentication_error"
