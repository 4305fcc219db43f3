"""/v1/messages and /v1/messages/count_tokens over a scripted fake engine: the request's translation into the
chat pipeline, the Message and its stream events (read by the anthropic SDK's own helpers too), and every error
in Anthropic's shape."""

import json

import anthropic
import httpx2
import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.errors import EngineRejected
from choir.core.settings import Settings
from choir.engine.protocol import NO_OPTIONS, EngineDead
from tests.fakes import FakeEngine, fake_engine_factory
from tests.test_parsers_routes import CALL, script, token_pieces, use_parsers

PATH = "/v1/messages"
MODEL = "fake-model"
HI = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER}]
EVENTS = ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
          "message_delta", "message_stop"]


def create(client, headers=None, **body):
    return client.post(PATH, json={"model": MODEL, "max_tokens": 20, "messages": HI, **body}, headers=headers)


def events_of(client, **body):
    response = create(client, stream=True, **body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["request-id"].startswith("msg_")
    lines = response.text.replace("\r\n", "\n").split("\n")
    names = [line[len("event: "):] for line in lines if line.startswith("event: ")]
    events = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    assert names == [event["type"] for event in events]  # every event is named by its type
    return events


def collapse(types):
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def anthropic_error(response, status, kind):
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"], body
    assert response.headers["request-id"] == body["request_id"]
    return body["error"]["message"]


def sdk_for(client, api_key="unused"):
    """The official SDK, speaking to the app in-process: its own HTTP client (httpx2) hands each request to
    Litestar's test client."""
    def forward(request):
        headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
        answer = client.request(request.method, request.url.raw_path.decode(), content=request.read(),
                                headers=headers)
        kept = [(k, v) for k, v in answer.headers.multi_items() if k not in ("content-length", "content-encoding")]
        return httpx2.Response(answer.status_code, headers=kept, content=answer.content)

    return anthropic.Anthropic(base_url="http://choir.test", api_key=api_key, max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(forward)))


@pytest.fixture
def sdk(client):
    return sdk_for(client)


def test_a_plain_message(client, fake_engine):
    response = create(client, system="be brief", headers={"X-Request-Id": "r1"})
    body = response.json()
    assert response.headers["request-id"] == "msg_r1"
    assert body == {"id": "msg_r1", "type": "message", "role": "assistant", "model": MODEL,
                    "content": [{"type": "text", "text": "Hello world!"}], "stop_reason": "end_turn",
                    "stop_sequence": None, "usage": {"input_tokens": body["usage"]["input_tokens"], "output_tokens": 12,
                                                     "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
    [call] = fake_engine.calls
    assert call.request_id == "msg_r1" and call.params.max_tokens == 20
    assert call.prompt.text == "<system>be brief<user>hi<assistant>"
    assert body["usage"]["input_tokens"] == len(call.prompt.token_ids)


def test_the_sdk_reads_the_message(sdk):
    message = sdk.messages.create(model=MODEL, max_tokens=20, messages=HI, metadata={"user_id": "u1"},
                                  extra_body={"temperature": 0.5, "top_k": 5, "top_p": 0.9})
    assert message.content[0].text == "Hello world!" and message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 12 and message._request_id == message.id


def test_sampling_fields_reach_the_engine(client, fake_engine):
    create(client, temperature=0.5, top_p=0.9, top_k=5, stop_sequences=["END"], metadata={"user_id": "u1"})
    params = fake_engine.calls[0].params
    assert (params.temperature, params.top_p, params.top_k, params.stop) == (0.5, 0.9, 5, ["END"])


def test_system_blocks_drop_claude_codes_billing_header(client, fake_engine):
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=abc;"},
              {"type": "text", "text": "You are a CLI.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Be terse."}]
    create(client, system=system)
    assert fake_engine.calls[0].prompt.text == "<system>You are a CLI.\nBe terse.<user>hi<assistant>"


def test_a_tool_round_trip_becomes_chat_messages(client, fake_engine):
    fake_engine.max_model_len = 2048
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "weather?", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "use the tool", "signature": "sig"},
            {"type": "text", "text": "Checking.", "citations": None},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}, "caller": None}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city", "is_error": True},
            {"type": "text", "text": "and tomorrow?"}]},
        {"role": "system", "content": "Remember: be brief."}]
    response = create(client, messages=messages, tools=TOOLS, tool_choice={"type": "none"})
    assert response.status_code == 200, response.text
    assert fake_engine.calls[0].prompt.text == ("<user>weather?<assistant>Checking.<tool>sunny<tool>Error: no such city"
                                                "<user>and tomorrow?<system>Remember: be brief.<assistant>")


def test_the_chat_messages_carry_calls_and_reasoning(client, fake_engine):
    seen = []
    original = fake_engine.render_chat

    async def render_chat(messages, template, options):
        seen.append(messages)
        return await original(messages, template, options)

    fake_engine.render_chat = render_chat
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "use the tool", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
    create(client, messages=messages, tools=TOOLS, tool_choice={"type": "none"})
    [chat] = seen
    assistant = chat[1]
    assert assistant["reasoning"] == "use the tool" and assistant["tool_calls"] == [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]
    assert chat[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}


def test_a_final_assistant_turn_is_continued(client, fake_engine):
    body = create(client, messages=[*HI, {"role": "assistant", "content": "The answer is"}]).json()
    assert fake_engine.calls[0].prompt.text == "<user>hi<assistant>The answer is"  # no new turn opened
    assert fake_engine.templates[-1].continue_final_message and not fake_engine.templates[-1].add_generation_prompt
    assert body["content"] == [{"type": "text", "text": "Hello world!"}]


def test_a_stop_sequence_is_reported(client, fake_engine):
    original = fake_engine.generate

    async def stopped(prompt, sampling, request_id, options=NO_OPTIONS):
        async for output in original(prompt, sampling, request_id, options):
            if output.finished:
                output.outputs[0].stop_reason = "END"
            yield output

    fake_engine.generate = stopped
    body = create(client, stop_sequences=["END"]).json()
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")
    events = events_of(client, stop_sequences=["END"])
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_max_tokens_and_the_context_window(client, fake_engine):
    fake_engine.script = lambda prompt, params: ["a"] * 100
    assert create(client, max_tokens=3).json()["stop_reason"] == "max_tokens"
    # Claude Code asks for tens of thousands: the budget is what the context leaves, and filling it says so
    body = create(client, max_tokens=32000).json()
    last = fake_engine.calls[-1]
    assert last.params.max_tokens == fake_engine.max_model_len - len(last.prompt.token_ids)
    assert body["stop_reason"] == "model_context_window_exceeded"


def test_the_stream_event_sequence(client):
    events = events_of(client)
    assert collapse([e["type"] for e in events]) == EVENTS
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert events[1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "Hello world!"
    assert events[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 12 and events[-2]["usage"]["input_tokens"] > 0
    assert events[-1] == {"type": "message_stop"}


def test_the_sdks_stream_helper_accumulates_the_message(sdk):
    with sdk.messages.stream(model=MODEL, max_tokens=20, messages=HI) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == final.content[0].text == "Hello world!"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 12


def test_an_empty_answer_is_one_empty_text_block(client, fake_engine):
    fake_engine.script = lambda prompt, params: [""]
    assert create(client).json()["content"] == [{"type": "text", "text": ""}]
    events = events_of(client)
    assert [e["type"] for e in events] == ["message_start", "content_block_start", "ping", "content_block_stop",
                                           "message_delta", "message_stop"]


def test_a_forced_tool_is_a_tool_use_block(client, fake_engine, sdk):
    fake_engine.max_model_len = 2048
    fake_engine.script = lambda prompt, params: ['{"city": ', '"Paris"}']
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any"}):
        if choice["type"] == "any":
            fake_engine.script = lambda prompt, params: ['[{"name": "get_weather", ',
                                                         '"parameters": {"city": "Paris"}}]']
        body = create(client, tools=TOOLS, tool_choice=choice, max_tokens=200).json()
        [block] = body["content"]
        assert block["type"] == "tool_use" and block["id"].startswith("toolu_") and block["name"] == "get_weather"
        assert block["input"] == {"city": "Paris"} and body["stop_reason"] == "tool_use"
        with sdk.messages.stream(model=MODEL, max_tokens=200, messages=HI, tools=TOOLS, tool_choice=choice) as stream:
            final = stream.get_final_message()
        assert final.content[0].input == {"city": "Paris"} and final.stop_reason == "tool_use"


def test_streamed_tool_input_is_json_deltas(client, fake_engine):
    fake_engine.max_model_len = 2048
    fake_engine.script = lambda prompt, params: ['{"city": ', '"Paris"}']
    events = events_of(client, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=200)
    assert collapse([e["type"] for e in events]) == EVENTS
    assert events[1]["content_block"]["type"] == "tool_use" and events[1]["content_block"]["input"] == {}
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"input_json_delta"}
    assert json.loads("".join(d["partial_json"] for d in deltas)) == {"city": "Paris"}


def test_a_call_cut_by_max_tokens_keeps_its_partial_input(client, fake_engine):
    fake_engine.max_model_len = 2048
    fake_engine.script = lambda prompt, params: ['{"city": "Paris", "da', 'ys": 3}']
    body = create(client, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=1).json()
    assert body["stop_reason"] == "max_tokens"
    assert body["content"] == [{"type": "tool_use", "id": body["content"][0]["id"], "name": "get_weather",
                                "input": {"city": "Paris"}}]  # the complete values, as the SDK reads the deltas


def test_auto_tools_read_by_the_tool_parser(client, fake_engine, sdk):
    use_parsers(client, fake_engine, tool="hermes")
    fake_engine.script = script(*token_pieces("Let me check. " + CALL))
    body = create(client, tools=TOOLS, max_tokens=200).json()
    assert [b["type"] for b in body["content"]] == ["text", "tool_use"] and body["stop_reason"] == "tool_use"
    assert body["content"][0]["text"] == "Let me check. " and body["content"][1]["input"] == {"city": "Paris"}
    with sdk.messages.stream(model=MODEL, max_tokens=200, messages=HI, tools=TOOLS) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == {"city": "Paris"}


def test_thinking_is_a_thinking_block_with_a_signature(client, fake_engine, sdk):
    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    fake_engine.script = script(*token_pieces("<think>Weighing it.</think>The answer."))
    thinking = {"type": "enabled", "budget_tokens": 50}
    body = create(client, thinking=thinking, max_tokens=100).json()
    [thought, text] = body["content"]
    assert thought["type"] == "thinking" and thought["thinking"] == "Weighing it." and thought["signature"]
    assert text == {"type": "text", "text": "The answer."}
    call = fake_engine.calls[-1]
    assert call.sampling.thinking_token_budget == 50
    assert fake_engine.templates[-1].kwargs["enable_thinking"] is True
    events = events_of(client, thinking=thinking, max_tokens=100)
    deltas = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert deltas[-1] == "text_delta" and "signature_delta" in deltas
    assert deltas.index("signature_delta") == max(i for i, d in enumerate(deltas) if d == "thinking_delta") + 1
    with sdk.messages.stream(model=MODEL, max_tokens=100, messages=HI, thinking=thinking) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == "Weighing it." and final.content[0].signature == thought["signature"]
    assert final.content[1].text == "The answer."
    create(client, thinking={"type": "disabled"})
    assert fake_engine.templates[-1].kwargs["enable_thinking"] is False


def test_output_config_shapes_the_answer(client, fake_engine):
    fake_engine.max_model_len = 2048
    fake_engine.script = lambda prompt, params: ['{"a": 1}']
    body = create(client, output_config={"format": {"type": "json_schema", "schema": {"type": "object"}},
                                         "effort": "low"}, max_tokens=100).json()
    assert json.loads(body["content"][0]["text"]) == {"a": 1}
    assert fake_engine.calls[-1].params.structured_outputs is not None
    assert fake_engine.templates[-1].kwargs["reasoning_effort"] == "low"


def test_claude_codes_headers_and_hints_are_accepted(client, fake_engine):
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,unknown-beta-2099-01-01",
               "x-app": "cli", "X-Claude-Code-Session-Id": "s1"}
    response = client.post(f"{PATH}?beta=true", headers=headers, json={
        "model": MODEL, "max_tokens": 20, "messages": HI, "cache_control": {"type": "ephemeral"},
        "context_management": {"edits": []}, "service_tier": "auto", "thinking": {"type": "adaptive"},
        "metadata": {"user_id": '{"device_id": "d"}'}})
    assert response.status_code == 200, response.text


def test_count_tokens_counts_what_a_message_would_send(client, fake_engine, sdk):
    request = {"model": MODEL, "messages": HI, "system": "be brief"}
    counted = client.post(f"{PATH}/count_tokens", json=request).json()
    create(client, system="be brief")
    assert counted == {"input_tokens": len(fake_engine.calls[-1].prompt.token_ids)}
    assert sdk.messages.count_tokens(model=MODEL, messages=HI, system="be brief").input_tokens == \
        counted["input_tokens"]
    assert not fake_engine.calls[1:]  # counting generates nothing
    long = [{"role": "user", "content": "x" * 500}]  # over the context: counted all the same
    assert client.post(f"{PATH}/count_tokens", json={"model": MODEL, "messages": long}).json()["input_tokens"] > 500


# Errors: Anthropic's shape, type and status, the field first in the message

@pytest.mark.parametrize("body, field", [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "ctx", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": [{"type": "server_tool_use"}]}]}, "messages.0.content.0.type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}]},
     "messages.0.content.0.type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "image", "source": {}}]}]}]},
     "messages.0.content.0.content.0.source.type"),
    ({"messages": [*HI, {"role": "assistant", "content": "trailing "}]}, "messages.1.content"),
    ({"messages": [*HI, {"role": "assistant", "content": [{"type": "text", "text": "trailing "},
                                                          {"type": "thinking", "thinking": "t"}]}]},
     "messages.1.content"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"name": "no_schema"}]}, "tools.0.input_schema"),
    ({"tools": [{"name": "bad name!", "input_schema": WEATHER}], "tool_choice": {"type": "any"}}, "tools.0.name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": TOOLS}, "tool_choice"),  # auto without a tool parser
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 5}},
     "thinking"),
    ({"thinking": {"type": "enabled", "budget_tokens": 20}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
    ({"container": "c1"}, "container"),
])
def test_invalid_requests_are_400s_naming_the_field(client, fake_engine, body, field):
    fake_engine.max_model_len = 2048
    request = {"model": MODEL, "max_tokens": 20, "messages": HI, **body}
    message = anthropic_error(client.post(PATH, json={k: v for k, v in request.items() if v is not None}), 400,
                              "invalid_request_error")
    assert message.startswith(f"{field}:") or f"`{field}`" in message, message
    assert not fake_engine.calls


def test_the_sdk_raises_its_own_error_classes(sdk, fake_engine):
    with pytest.raises(anthropic.NotFoundError) as unknown:
        sdk.messages.create(model="claude-sonnet-4-5", max_tokens=20, messages=HI)
    assert unknown.value.type == "not_found_error" and "claude-sonnet-4-5" in unknown.value.message
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model=MODEL, max_tokens=20, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://example.com/a.png"}}]}])
    assert bad.value.type == "invalid_request_error" and bad.value.request_id


def test_a_prompt_too_long_in_anthropics_words(client):
    message = anthropic_error(create(client, messages=[{"role": "user", "content": "x" * 500}]), 400,
                              "invalid_request_error")
    assert message.startswith("prompt is too long: ") and message.endswith(" tokens > 63 maximum")  # as Anthropic's


@pytest.mark.parametrize("failure", [EngineDead("gone"), EngineRejected("The engine's queue is full.", status=503)])
def test_a_dead_or_saturated_engine_is_529_overloaded(client, fake_engine, failure):
    fake_engine.fail_with = failure
    anthropic_error(create(client), 529, "overloaded_error")
    anthropic_error(create(client, stream=True), 529, "overloaded_error")


def test_a_failure_mid_stream_is_an_error_event(client, fake_engine):
    original = fake_engine.generate

    async def failing(prompt, sampling, request_id, options=NO_OPTIONS):
        async for output in original(prompt, sampling, request_id, options):
            yield output
            raise EngineDead("engine died mid-stream")

    fake_engine.generate = failing
    events = events_of(client)
    assert events[0]["type"] == "message_start"
    error = events[-1]
    assert error == {"type": "error", "error": {"type": "overloaded_error", "message": error["error"]["message"]},
                     "request_id": events[0]["message"]["id"]}


def test_a_bug_is_a_500_api_error_without_internals(client, fake_engine):
    fake_engine.fail_with = RuntimeError("secret /internal/path")
    message = anthropic_error(create(client), 500, "api_error")
    assert "secret" not in message


@pytest.mark.parametrize("content, headers, status, kind", [
    (b"{not json", {"content-type": "application/json"}, 400, "invalid_request_error"),
    (b"{}", {"content-type": "text/plain"}, 415, "invalid_request_error"),
    (b'{"model": "fake-model"}', {"content-type": "application/json"}, 400, "invalid_request_error"),
])
def test_malformed_bodies(client, content, headers, status, kind):
    response = client.post(PATH, content=content, headers=headers)
    anthropic_error(response, status, kind)
    assert response.headers["request-id"].startswith("req_")  # it failed before it had a message id


def test_a_body_over_the_limit_is_413_request_too_large():
    app = create_app(Settings(served_model_name=MODEL, max_body_bytes=1000),
                     engine_factory=fake_engine_factory(FakeEngine()))
    with TestClient(app) as client:
        anthropic_error(create(client, messages=[{"role": "user", "content": "x" * 2000}]), 413, "request_too_large")


def test_keys_by_x_api_key_or_bearer():
    app = create_app(Settings(served_model_name=MODEL, api_keys=("k1",)),
                     engine_factory=fake_engine_factory(FakeEngine()))
    with TestClient(app) as client:
        assert anthropic_error(create(client), 401, "authentication_error").startswith("Missing API key")
        anthropic_error(create(client, headers={"x-api-key": "wrong"}), 401, "authentication_error")
        assert create(client, headers={"x-api-key": "k1"}).status_code == 200
        assert create(client, headers={"Authorization": "Bearer k1"}).status_code == 200
        assert sdk_for(client, "k1").messages.create(model=MODEL, max_tokens=5, messages=HI).content
        chat = client.post("/v1/chat/completions", json={"messages": HI}, headers={"x-api-key": "k1"})
        assert chat.status_code == 200
        # the OpenAI routes keep OpenAI's shape
        assert client.post("/v1/chat/completions", json={"messages": HI}).json()["error"]["code"] == 401


def test_a_wrong_method_is_a_405_in_anthropics_shape(client):
    anthropic_error(client.get(PATH), 405, "invalid_request_error")
    anthropic_error(client.get(f"{PATH}/"), 405, "invalid_request_error")
    assert client.get("/v1/chat/completions").json()["error"]["code"] == 405  # OpenAI's routes: OpenAI's shape


def test_two_calls_with_parallel_tool_use_disabled_give_one(client, fake_engine):
    use_parsers(client, fake_engine, tool="hermes")
    fake_engine.script = script(*token_pieces(CALL + CALL.replace("Paris", "Rome")))
    both = create(client, tools=TOOLS, max_tokens=200).json()["content"]
    assert [b["input"]["city"] for b in both] == ["Paris", "Rome"]
    one = create(client, tools=TOOLS, max_tokens=200,
                 tool_choice={"type": "auto", "disable_parallel_tool_use": True}).json()["content"]
    assert [b["input"]["city"] for b in one] == ["Paris"]
    events = events_of(client, tools=TOOLS, max_tokens=200,
                       tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"] == ["tool_use"]


def test_a_final_assistant_turn_that_called_a_tool_is_not_a_prefill(client, fake_engine):
    fake_engine.max_model_len = 2048
    messages = [*HI, {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check. "},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]}]
    assert create(client, messages=messages, tools=TOOLS, tool_choice={"type": "none"}).status_code == 200
    assert fake_engine.templates[-1].add_generation_prompt


def test_blocks_of_equal_text_close_at_their_own_index(client, fake_engine):
    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    fake_engine.script = script(*token_pieces("ok<think>hm</think>ok"))
    events = events_of(client, max_tokens=100)
    starts = [e["index"] for e in events if e["type"] == "content_block_start"]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert starts == stops == list(range(len(starts)))


def test_a_call_named_without_arguments_is_no_tool_use(client, fake_engine):
    """A parsed call whose arguments never began makes no block, so the answer did not stop to use a tool."""
    use_parsers(client, fake_engine, tool="hermes")
    fake_engine.script = script(*token_pieces('<tool_call>\n{"name": "get_weather"}\n</tool_call>'))
    whole = create(client, tools=TOOLS, max_tokens=200).json()
    events = events_of(client, tools=TOOLS, max_tokens=200)
    blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert "tool_use" not in blocks and events[-2]["delta"]["stop_reason"] == whole["stop_reason"] != "tool_use"
