"""tool_choice required / named and response_format over a scripted fake engine: what constrains the
engine, and how the (scripted) constrained output comes back as tool calls, whole or streamed."""

import json

import pytest

from tests.sse import sse_json

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "weather?"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
REQUIRED_OUTPUT = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'


@pytest.fixture(autouse=True)
def roomy_context(fake_engine):
    fake_engine.max_model_len = 2048  # room for a one-character-per-token script


def scripted(text: str, size: int):
    return lambda prompt, params: [text[i:i + size] for i in range(0, len(text), size)]


def streamed_calls(chunks, index=0):
    """Tool calls assembled from stream deltas, as the OpenAI SDK assembles them."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        choice = chunk["choices"][0]
        if choice["index"] != index:
            continue
        assert "content" not in choice["delta"] or choice["delta"]["content"] in ("", None)
        entries = choice["delta"].get("tool_calls", [])
        assert len({call["index"] for call in entries}) == len(entries), "one entry per call in a chunk, as OpenAI"
        for call in entries:
            entry = calls.setdefault(call["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in call:
                assert entry["id"] is None  # the header comes once
                entry["id"], entry["name"] = call["id"], call["function"]["name"]
            entry["arguments"] += call.get("function", {}).get("arguments", "")
    return [calls[i] for i in sorted(calls)]


def test_named_tool_constrains_the_output_to_its_parameters(client, fake_engine):
    fake_engine.script = scripted('{"city": "Paris"}', 4)
    body = client.post(CHAT, json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED}).json()
    assert fake_engine.calls[0].params.structured_outputs.json == WEATHER
    [choice] = body["choices"]
    assert choice["message"]["content"] == ""
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert choice["finish_reason"] == "stop"  # a forced tool is not "tool_calls"


def test_required_constrains_the_output_to_a_list_of_calls(client, fake_engine):
    fake_engine.script = scripted(REQUIRED_OUTPUT, 7)
    body = client.post(CHAT, json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"}).json()
    schema = fake_engine.calls[0].params.structured_outputs.json
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    assert [item["properties"]["name"]["const"] for item in schema["items"]["anyOf"]] == ["get_weather", "get_time"]
    [choice] = body["choices"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None


# What pydantic writes for a model with a nested model: `$ref`s into the parameters' own `$defs`.
PYDANTIC_WEATHER = {"type": "object", "title": "GetWeather",
                    "properties": {"city": {"type": "string", "maxLength": 12},
                                   "options": {"$ref": "#/$defs/WeatherOptions"}},
                    "required": ["city", "options"],
                    "$defs": {"WeatherOptions": {"type": "object", "properties": {
                        "unit": {"enum": ["c", "f"]}, "next": {"anyOf": [{"$ref": "#/$defs/WeatherOptions"},
                                                                          {"type": "null"}]}},
                        "required": ["unit"]}}}
PYDANTIC_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PYDANTIC_WEATHER}},
                  {"type": "function", "function": {"name": "get_time", "parameters": WEATHER}}]


def test_required_keeps_each_tools_definitions(client, fake_engine):
    """pydantic's `$defs`: the combined schema for `required` must still resolve every `$ref`."""
    import jsonschema

    output = ('[{"name": "get_weather", "parameters": {"city": "Paris", "options": {"unit": "c", "next": '
              '{"unit": "f", "next": null}}}}, {"name": "get_time", "parameters": {"city": "Oslo"}}]')
    fake_engine.script = scripted(output, 9)
    body = client.post(CHAT, json={"messages": MESSAGES, "tools": PYDANTIC_TOOLS, "tool_choice": "required"}).json()
    schema = fake_engine.calls[0].params.structured_outputs.json
    [weather, time] = schema["items"]["anyOf"]
    assert weather["properties"]["parameters"] == {"$ref": "#/$defs/get_weather"}
    assert time["properties"]["parameters"] == WEATHER  # a schema without refs stays in place
    moved = schema["$defs"]["get_weather"]
    assert moved["properties"]["options"] == {"$ref": "#/$defs/get_weather/$defs/WeatherOptions"}
    jsonschema.validate(json.loads(output), schema)  # every pointer resolves
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "parameters": {"city": "Paris", "options": {"unit": "k"}}}],
                            schema)
    assert [c["function"]["name"] for c in body["choices"][0]["message"]["tool_calls"]] == ["get_weather", "get_time"]
    assert PYDANTIC_TOOLS[0]["function"]["parameters"]["properties"]["options"]["$ref"] == "#/$defs/WeatherOptions"


def test_a_named_tool_keeps_its_schema_as_sent(client, fake_engine):
    named = {"type": "function", "function": {"name": "get_weather"}}
    client.post(CHAT, json={"messages": MESSAGES, "tools": PYDANTIC_TOOLS, "tool_choice": named})
    assert fake_engine.calls[0].params.structured_outputs.json == PYDANTIC_WEATHER


def test_parallel_tool_calls_false_allows_one_call(client, fake_engine):
    client.post(CHAT, json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
                            "parallel_tool_calls": False})
    assert fake_engine.calls[0].params.structured_outputs.json["maxItems"] == 1


def test_tools_reach_the_chat_template(client, fake_engine):
    client.post(CHAT, json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"})
    assert [t["function"]["name"] for t in fake_engine.templates[0].kwargs["tools"]] == ["get_weather", "get_time"]


@pytest.mark.parametrize("cut", range(1, len(REQUIRED_OUTPUT)))
@pytest.mark.parametrize("choice, output", [("required", REQUIRED_OUTPUT), (NAMED, '{"city": "Paris"}')])
def test_a_forced_call_cut_short_says_length_and_matches_its_stream(client, fake_engine, cut, choice, output):
    """max_tokens cuts the constrained JSON at every point: finish_reason is "length", and the whole
    answer has exactly the calls a client assembles from the stream (the last one's arguments cut)."""
    if cut >= len(output):
        return
    fake_engine.script = scripted(output, 1)
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": choice, "max_tokens": cut}
    whole = client.post(CHAT, json=body).json()["choices"][0]
    chunks, _ = sse_json(client.post(CHAT, json={**body, "stream": True}).text)
    assert whole["finish_reason"] == "length"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == ["length"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in whole["message"].get("tool_calls", [])]
    assert calls == [(c["name"], c["arguments"]) for c in streamed_calls(chunks)]
    assert whole["message"]["content"] in ("", None)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 200])
@pytest.mark.parametrize("n", [1, 2])
def test_streamed_required_calls_equal_the_whole_ones(client, fake_engine, size, n):
    fake_engine.script = scripted(REQUIRED_OUTPUT, size)
    chunks, done = sse_json(client.post(CHAT, json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
                                                    "stream": True, "n": n}).text)
    assert done == 1
    for index in range(n):
        calls = streamed_calls(chunks, index)
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                           ("get_time", {})]
        assert len({c["id"] for c in calls}) == 2
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["index"] == index]
        assert [f for f in finishes if f] == ["tool_calls"]


@pytest.mark.parametrize("size", [1, 4, 100])
def test_streamed_named_call(client, fake_engine, size):
    fake_engine.script = scripted('{"city": "Paris"}', size)
    chunks, _ = sse_json(client.post(CHAT, json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED,
                                                 "stream": True}).text)
    [call] = streamed_calls(chunks)
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == ["stop"]


def test_tool_choice_none_leaves_the_output_free(client, fake_engine):
    body = client.post(CHAT, json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"}).json()
    assert fake_engine.calls[0].params.structured_outputs is None
    assert body["choices"][0]["message"]["content"] == "Hello world!"


@pytest.mark.parametrize("response_format, expected", [
    ({"type": "json_object"}, {"json_object": True}),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}, {"json": WEATHER}),
    ({"type": "text"}, None),
])
def test_response_format_reaches_the_engine(client, fake_engine, response_format, expected):
    assert client.post(CHAT, json={"messages": MESSAGES, "response_format": response_format}).status_code == 200
    structured = fake_engine.calls[0].params.structured_outputs
    if expected is None:
        assert structured is None
    else:
        assert {key: getattr(structured, key) for key in expected} == expected


TAB_OUTPUT = '{"city": "Pa\tris\x1b"}'  # xgrammar lets raw control characters into strings; JSON does not


@pytest.mark.parametrize("size", [1, 3, 100])
def test_forced_arguments_are_strict_json_whole_and_streamed(client, fake_engine, size):
    fake_engine.script = scripted(TAB_OUTPUT, size)
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED}
    [call] = client.post(CHAT, json=body).json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Pa\tris\x1b"}  # strict json.loads
    chunks, _ = sse_json(client.post(CHAT, json={**body, "stream": True}).text)
    [streamed] = streamed_calls(chunks)
    assert streamed["arguments"] == call["function"]["arguments"]
    fake_engine.script = scripted(f'[{{"name": "get_weather", "parameters": {TAB_OUTPUT}}}]', size)
    required = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"}
    [whole] = client.post(CHAT, json=required).json()["choices"][0]["message"]["tool_calls"]
    [part] = streamed_calls(sse_json(client.post(CHAT, json={**required, "stream": True}).text)[0])
    assert json.loads(whole["function"]["arguments"]) == json.loads(part["arguments"]) == {"city": "Pa\tris\x1b"}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_json_constrained_text_is_strict_json(client, fake_engine, path):
    fake_engine.script = scripted(TAB_OUTPUT, 2)
    body = {"messages": MESSAGES} if path == CHAT else {"prompt": "x"}
    body["response_format"] = {"type": "json_object"}
    choice = client.post(path, json={**body, "max_tokens": 100}).json()["choices"][0]
    text = choice["message"]["content"] if path == CHAT else choice["text"]
    assert json.loads(text) == {"city": "Pa\tris\x1b"}
    free = client.post(path, json={k: v for k, v in body.items() if k != "response_format"}).json()["choices"][0]
    assert "\t" in (free["message"]["content"] if path == CHAT else free["text"])  # free text is left as it is


def test_a_named_call_cut_before_its_arguments_is_no_call(client, fake_engine):
    """As OpenAI and vLLM (its own test: max_completion_tokens 1): finish_reason "length", no tool_calls,
    content "", whole and streamed."""
    fake_engine.script = lambda prompt, params: [""]
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED, "max_tokens": 1}
    choice = client.post(CHAT, json=body).json()["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == ""
    chunks, _ = sse_json(client.post(CHAT, json={**body, "stream": True}).text)
    assert streamed_calls(chunks) == [] and chunks[-1]["choices"][0]["finish_reason"] == "length"
