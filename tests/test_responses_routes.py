"""/v1/responses over a scripted fake engine: the request's translation and the event sequence."""

import json

import pytest

from choir.engine.protocol import NO_OPTIONS
from tests.sse import sse_payloads

PATH = "/v1/responses"
MESSAGE_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                  "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                  "response.content_part.done", "response.output_item.done"]


def events_of(client, body):
    response = client.post(PATH, json={**body, "stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    names = [line[len("event: "):] for line in response.text.replace("\r\n", "\n").split("\n")
             if line.startswith("event: ")]
    events = [json.loads(p) for p in sse_payloads(response.text)]
    assert names == [e["type"] for e in events]  # every event is named by its type
    return events


def collapse(types):
    """Runs of the same event type as one: the shape of the sequence."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def test_plain_response(client, fake_engine):
    body = client.post(PATH, json={"input": "hi", "instructions": "be brief", "max_output_tokens": 20},
                       headers={"X-Request-Id": "r1"}).json()
    assert body["id"] == "resp_r1" and body["object"] == "response" and body["status"] == "completed"
    [item] = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": "Hello world!", "annotations": [], "logprobs": []}]
    usage = body["usage"]
    assert usage["output_tokens"] == 12 and usage["total_tokens"] == usage["input_tokens"] + 12
    [call] = fake_engine.calls
    assert call.request_id == "resp_r1" and call.params.max_tokens == 20
    assert call.prompt.text.startswith("<system>be brief<user>hi")


def test_input_items_become_the_conversation(client, fake_engine):
    client.post(PATH, json={"input": [
        {"role": "user", "content": "first"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "answer"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "second"}]}]})
    assert fake_engine.calls[0].prompt.text == "<user>first<assistant>answer<user>second<assistant>"


def test_event_sequence_and_numbers(client):
    events = events_of(client, {"input": "hi"})
    assert collapse([e["type"] for e in events]) == [*MESSAGE_EVENTS, "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert deltas == done["text"] == "Hello world!"
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Hello world!"
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []


def test_max_output_tokens_makes_it_incomplete(client, fake_engine):
    fake_engine.script = lambda prompt, params: ["a", "b", "c", "d"]
    body = client.post(PATH, json={"input": "hi", "max_output_tokens": 2}).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    events = events_of(client, {"input": "hi", "max_output_tokens": 2})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_forced_function_call(client, fake_engine):
    fake_engine.max_model_len = 2048
    fake_engine.script = lambda prompt, params: ['{"city": ', '"Paris"}']
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    body = client.post(PATH, json={"input": "weather?", "tools": tools,
                                   "tool_choice": {"type": "function", "name": "get_weather"}}).json()
    calls = [item for item in body["output"] if item["type"] == "function_call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert fake_engine.calls[0].params.structured_outputs.json == {"type": "object"}
    events = events_of(client, {"input": "weather?", "tools": tools,
                                "tool_choice": {"type": "function", "name": "get_weather"}})
    assert collapse([e["type"] for e in events]) == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    arguments = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(arguments) == {"city": "Paris"}


def test_a_named_tool_beside_a_text_format(client, fake_engine):
    """instructor's RESPONSES_TOOLS mode: text.format and a forced tool; the call is the answer."""
    fake_engine.max_model_len = 2048
    fake_engine.script = lambda prompt, params: ['{"city": ', '"Paris"}']
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    body = {"input": "weather?", "tools": tools, "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}}}
    response = client.post(PATH, json=body)
    assert response.status_code == 200, response.text
    assert [item["type"] for item in response.json()["output"]] == ["function_call"]
    events = events_of(client, body)
    assert events[-1]["type"] == "response.completed"


def test_text_format_json_schema_reaches_the_engine(client, fake_engine):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    client.post(PATH, json={"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}})
    assert fake_engine.calls[0].params.structured_outputs.json == schema


def test_engine_failure_mid_stream_is_response_failed(client, fake_engine):
    original = fake_engine.generate

    async def generate(prompt, params, request_id, options=NO_OPTIONS):
        async for output in original(prompt, params, request_id, options):
            yield output
            raise RuntimeError("engine broke")

    fake_engine.generate = generate
    events = events_of(client, {"input": "hi"})
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["status"] == "failed"
    error = events[-1]["response"]["error"]
    # The client learns that it failed, not the server's internals.
    assert error["code"] == "server_error" and error["message"] and "engine broke" not in error["message"]


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": []}, "input"),
    ({"input": [{"type": "image", "url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0]"),
    ({"input": "x", "model": "nope"}, "model"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}}, "text.format.schema"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
])
def test_invalid_requests_are_400(client, fake_engine, body, param):
    response = client.post(PATH, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert fake_engine.calls == []


def test_tool_choice_auto_without_tools_is_openais_default(client, fake_engine):
    body = client.post(PATH, json={"input": "hi", "tool_choice": "auto"}).json()
    assert body["status"] == "completed" and body["tool_choice"] == "auto"
    assert fake_engine.calls[0].params.structured_outputs is None
    assert "tools" not in fake_engine.templates[0].kwargs


def test_chat_template_kwargs_reach_the_template(client, fake_engine):
    client.post(PATH, json={"input": "hi", "chat_template_kwargs": {"enable_thinking": False, "x": 1}})
    assert fake_engine.templates[0].kwargs == {"enable_thinking": False, "x": 1}


def test_store_false_is_accepted(client):
    assert client.post(PATH, json={"input": "x", "store": False}).status_code == 200


REASONING_EVENTS = ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                    "response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]


def test_store_true_is_tolerated_and_nothing_is_stored(client):
    body = client.post(PATH, json={"input": "x", "store": True}).json()
    assert body["status"] == "completed" and body["store"] is False  # says what happened


def test_reasoning_becomes_a_reasoning_item(client, fake_engine):
    from tests.test_parsers_routes import THOUGHT, token_pieces, use_parsers

    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    fake_engine.script = lambda prompt, params: token_pieces(THOUGHT + "Answer.")
    body = client.post(PATH, json={"input": "hi", "reasoning": {"effort": "high", "summary": "auto"}}).json()
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_") and reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "The user wants weather."}]
    assert message["content"][0]["text"] == "Answer."
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert fake_engine.templates[-1].kwargs["reasoning_effort"] == "high"
    events = events_of(client, {"input": "hi"})
    assert collapse([e["type"] for e in events]) == [
        "response.created", "response.in_progress", *REASONING_EVENTS, *MESSAGE_EVENTS[2:], "response.completed"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert text == "The user wants weather."
    final = events[-1]["response"]["output"]
    assert [item["type"] for item in final] == ["reasoning", "message"]
    assert final[0]["content"][0]["text"] == text and final[0]["status"] == "completed"
    hidden = client.post(PATH, json={"input": "hi", "include_reasoning": False}).json()
    assert [item["type"] for item in hidden["output"]] == ["message"]


def test_reasoning_input_goes_to_its_assistant_turn(client, fake_engine):
    client.post(PATH, json={"input": [
        {"role": "user", "content": "q1"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}],
         "content": [{"type": "reasoning_text", "text": "long thought"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a1"}]},
        {"role": "user", "content": "q2"}]})
    # The fake template shows no reasoning; the message the template got has it.
    assert fake_engine.calls[0].prompt.text == "<user>q1<assistant>a1<user>q2<assistant>"


def test_reasoning_input_reaches_the_template(client, fake_engine, monkeypatch):
    seen = []
    original = fake_engine.render_chat

    async def render_chat(messages, template, options):
        seen.append(messages)
        return await original(messages, template, options)

    monkeypatch.setattr(fake_engine, "render_chat", render_chat)
    client.post(PATH, json={"input": [
        {"role": "user", "content": "q1"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "only a summary"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"}]})
    assistant = seen[0][1]
    assert assistant["role"] == "assistant" and assistant["reasoning"] == "only a summary"
    assert assistant["reasoning_content"] == "only a summary" and assistant["tool_calls"][0]["id"] == "c1"


def test_encrypted_reasoning_is_refused(client):
    response = client.post(PATH, json={"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input[0].encrypted_content"


def test_errors_name_the_responses_fields(client, fake_engine):
    fake_engine.max_model_len = 50
    error = client.post(PATH, json={"input": "x", "max_output_tokens": 60}).json()["error"]
    assert error["param"] == "max_output_tokens" and "max_output_tokens" in error["message"]
    assert "max_completion_tokens" not in error["message"]
    long = client.post(PATH, json={"input": "x" * 60}).json()["error"]
    assert long["param"] == "input"


def test_cached_input_tokens(client, fake_engine):
    fake_engine.cached_tokens = 3
    assert client.post(PATH, json={"input": "x"}).json()["usage"]["input_tokens_details"] == {"cached_tokens": 3}
    final = events_of(client, {"input": "x"})[-1]["response"]
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 3}


@pytest.mark.parametrize("choice", [None, {"type": "function", "name": "get_weather"}])
def test_an_output_that_ends_in_its_reasoning_has_only_the_reasoning(client, fake_engine, choice):
    """As vLLM's server: no message without text and no call that never began, whole or streamed."""
    from tests.test_parsers_routes import token_pieces, use_parsers

    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    fake_engine.script = lambda prompt, params: token_pieces("<think>Still thinking about it")
    body = {"input": "hi", "max_output_tokens": 3}
    if choice:
        body |= {"tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
                 "tool_choice": choice}
    whole = client.post(PATH, json=body).json()
    assert [item["type"] for item in whole["output"]] == ["reasoning"] and whole["status"] == "incomplete"
    events = events_of(client, body)
    types = [e["type"] for e in events]
    assert collapse(types) == ["response.created", "response.in_progress", *REASONING_EVENTS, "response.incomplete"]
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["reasoning"]


def test_nothing_said_is_no_item(client, fake_engine):
    fake_engine.script = lambda prompt, params: [""]
    assert client.post(PATH, json={"input": "hi"}).json()["output"] == []
    events = events_of(client, {"input": "hi"})
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]


def test_output_text_logprobs_whole_and_streamed(client, fake_engine):
    body = {"input": "hi", "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    response = client.post(PATH, json=body).json()
    [part] = response["output"][0]["content"]
    assert len(part["logprobs"]) == len("Hello world!") and response["top_logprobs"] == 2
    first = part["logprobs"][0]
    assert (first["token"], first["logprob"], first["bytes"]) == ("H", -0.5, [72])
    assert [top["token"] for top in first["top_logprobs"]] == ["H", "\x01"] and "bytes" in first["top_logprobs"][0]
    assert fake_engine.calls[0].params.logprobs == 2
    events = events_of(client, body)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    streamed = [lp for e in deltas for lp in e["logprobs"]]
    assert [lp["token"] for lp in streamed] == [lp["token"] for lp in part["logprobs"]]
    assert "bytes" not in streamed[0] and set(streamed[0]["top_logprobs"][0]) == {"token", "logprob"}
    final = events[-1]["response"]["output"][0]["content"][0]
    assert final["logprobs"] == part["logprobs"]
    plain = client.post(PATH, json={"input": "hi", "top_logprobs": 2}).json()
    assert plain["output"][0]["content"][0]["logprobs"] == [] and plain["top_logprobs"] is None
    assert fake_engine.calls[-1].params.logprobs is None


def test_the_vllm_profile_ends_a_cut_stream_with_response_completed():
    from tests.fakes import FakeEngine
    from tests.test_compat import make_client

    engine = FakeEngine(script=lambda prompt, params: ["a", "b", "c", "d"])
    with make_client("vllm", engine=engine) as client:
        events = events_of(client, {"input": "hi", "max_output_tokens": 2})
    last = events[-1]
    assert last["type"] == "response.completed" and last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
