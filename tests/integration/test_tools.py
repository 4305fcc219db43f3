"""Tools and structured outputs on the real engine (the tiny random model) through the OpenAI SDK:
the JSON-schema constraint is what makes its gibberish parse."""

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.engine
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
             "required": ["zone"], "additionalProperties": False}}}]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ENOUGH = 400  # tokens: room for the constrained JSON to finish (the random model still may not)


def test_named_tool_returns_a_call_whose_arguments_validate(client, model):
    chat = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=ENOUGH, seed=1,
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = chat.choices[0]
    assert choice.message.content == "" and choice.finish_reason == "stop"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_required_returns_calls_whose_arguments_validate(client, model):
    """The random model may fill any budget with whitespace or a string (finish_reason "length"); every
    call of an answer that finished validates, and some finish."""
    chat = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                          max_tokens=ENOUGH, seed=2, n=4)
    finished = [choice for choice in chat.choices if choice.finish_reason == "tool_calls"]
    assert finished and all(choice.finish_reason in ("tool_calls", "length") for choice in chat.choices)
    for choice in finished:
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _assembled(stream):
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"name": None, "arguments": ""})
            if delta.function and delta.function.name:
                entry["name"] = delta.function.name
            if delta.function and delta.function.arguments:
                entry["arguments"] += delta.function.arguments
    return [calls[i] for i in sorted(calls)], finish


def test_streamed_required_calls_validate_and_equal_the_whole_ones(client, model):
    for seed in range(3, 9):
        kwargs = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=ENOUGH,
                      seed=seed)
        whole = client.chat.completions.create(**kwargs).choices[0]
        calls, finish = _assembled(client.chat.completions.create(stream=True, **kwargs))
        assert finish == whole.finish_reason and calls
        if finish == "length":  # the same calls, the last cut short
            assert [(c["name"], c["arguments"]) for c in calls] == \
                [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
            continue
        assert finish == "tool_calls"
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
            [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
        for call in calls:
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        return
    raise AssertionError("no seed finished its calls within the budget")


def test_streamed_named_call_validates(client, model):
    calls, finish = _assembled(client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, max_tokens=ENOUGH, seed=4, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_time"}}))
    [call] = calls
    assert call["name"] == "get_time" and finish == "stop"
    jsonschema.validate(json.loads(call["arguments"]), SCHEMAS["get_time"])


def test_response_format_json_schema_gives_valid_json(client, model):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20},
                                               "score": {"type": "number"}},
              "required": ["answer", "score"], "additionalProperties": False}
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=ENOUGH, seed=5,
                                          response_format={"type": "json_schema",
                                                           "json_schema": {"name": "answer", "schema": schema}})
    jsonschema.validate(json.loads(chat.choices[0].message.content), schema)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=ENOUGH, seed=5, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}))
    assert json.loads(streamed) == json.loads(chat.choices[0].message.content)


def test_response_format_json_object_gives_a_json_object(client, model):
    """json_object bounds no string, so a random model may run out of tokens inside one: what it wrote
    must still be a JSON object, complete when it stopped on its own."""
    import partial_json_parser

    for seed in range(6, 10):
        choice = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=ENOUGH, seed=seed,
                                                response_format={"type": "json_object"}).choices[0]
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
        else:
            assert isinstance(partial_json_parser.loads(choice.message.content), dict)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8, 13, 21, 34, 55, 89])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_either_parses_and_validates_or_says_length(client, model, max_tokens, choice):
    """Small budgets cut the constrained JSON anywhere: then finish_reason is "length" (and the stream
    said the same calls); with room, every call's arguments parse and follow the tool's schema."""
    kwargs = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=max_tokens, seed=7)
    choice_out = client.chat.completions.create(**kwargs).choices[0]
    calls, finish = _assembled(client.chat.completions.create(stream=True, **kwargs))
    assert finish == choice_out.finish_reason
    whole = [(c.function.name, c.function.arguments) for c in choice_out.message.tool_calls or []]
    if choice_out.finish_reason == "length":
        assert [name for name, _ in whole] == [c["name"] for c in calls]
        return
    assert choice_out.finish_reason == ("tool_calls" if choice == "required" else "stop") and whole
    for name, arguments in whole:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_a_forced_call_with_the_default_budget(client, model):
    """As a new user tries it: no max_tokens, so the whole context is the budget. The random model may
    still fill it inside a string; whatever it does, the answer says which case it is."""
    for seed in range(3):
        choice = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, seed=seed,
                                                tool_choice="required").choices[0]
        assert choice.finish_reason in ("tool_calls", "length")
        if choice.finish_reason == "tool_calls":
            for call in choice.message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


class WeatherOptions(BaseModel):
    unit: Literal["c", "f"]
    days: int = Field(ge=1, le=7)


class GetWeather(BaseModel):
    """What the Agents SDK, instructor and pydantic-ai send: a nested model becomes `$defs` + `$ref`."""

    city: str = Field(max_length=12)
    options: WeatherOptions


class GetTime(BaseModel):
    zone: Literal["UTC", "CET"]


PYDANTIC_TOOLS = [openai.pydantic_function_tool(GetWeather), openai.pydantic_function_tool(GetTime)]
PYDANTIC_MODELS = {"GetWeather": GetWeather, "GetTime": GetTime}


def test_pydantic_tools_with_definitions_and_tool_choice_required(client, model):
    assert "$defs" in PYDANTIC_TOOLS[0]["function"]["parameters"]
    finished = 0
    for seed in range(4):
        kwargs = dict(model=model, messages=MESSAGES, tools=PYDANTIC_TOOLS, tool_choice="required", seed=seed,
                      max_tokens=ENOUGH)
        choice = client.chat.completions.create(**kwargs).choices[0]
        assert choice.finish_reason in ("tool_calls", "length")
        if choice.finish_reason == "tool_calls":
            finished += 1
            for call in choice.message.tool_calls:
                PYDANTIC_MODELS[call.function.name].model_validate_json(call.function.arguments)
        calls, finish = _assembled(client.chat.completions.create(stream=True, **kwargs))
        assert finish == choice.finish_reason
    assert finished


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_streamed_forced_call_has_one_entry_per_call_in_each_chunk(client, model, choice):
    """OpenAI's shape, which instructor's partial streaming relies on: it reads a chunk's first entry
    of an index only, so the call's header and its first argument text come in one entry."""
    stream = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                                            max_tokens=ENOUGH, seed=3, stream=True)
    first_entries = ""
    headers = 0
    for chunk in stream:
        entries = chunk.choices[0].delta.tool_calls or []
        assert len({entry.index for entry in entries}) == len(entries)
        for entry in entries:
            headers += entry.id is not None
            if entry.index == 0:
                first_entries += entry.function.arguments or ""
    assert headers >= 1 and first_entries.startswith("{")


ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
SWEEP_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}},
               {"type": "function", "function": {"name": "add", "parameters": ADD}}]


@pytest.mark.parametrize("max_tokens", [200, 400])
def test_forced_calls_do_not_loop_on_whitespace_or_digits(client, model, max_tokens):
    """The report's sweep: n=2, temperature 1, seeds 0-5. vLLM's grammar let the random model write
    whitespace until the budget ended (6 of 12 choices at 200 tokens); Choir's engine defaults allow none
    between tokens and bound integers to JSON's safe range. What may still meet 200 tokens is content: a
    choice that wrote several calls of 16-digit integers (3 of 12, measured). With 400, every choice finishes."""
    finished = 0
    for seed in range(6):
        chat = client.chat.completions.create(model=model, messages=MESSAGES, tools=SWEEP_TOOLS, n=2, seed=seed,
                                              tool_choice="required", max_tokens=max_tokens, temperature=1)
        for choice in chat.choices:
            calls = choice.message.tool_calls or []
            for call in calls[:-1] if choice.finish_reason == "length" else calls:
                arguments = json.loads(call.function.arguments)
                assert all(abs(value) < 2**53 for value in arguments.values() if isinstance(value, int))
            if choice.finish_reason == "length":
                assert len(calls) >= 3 and max_tokens == 200, calls
                assert not any(run in call.function.arguments for call in calls for run in ("   ", "\n\n"))
            else:
                finished += 1
    assert finished == 12 if max_tokens == 400 else finished >= 6
