"""A server with vLLM's qwen3 reasoning parser and hermes tool parser, priority scheduling and a 512-token
context, on the real engine through the OpenAI SDK: the parser sees the template kwargs, the engine's
structured outputs know the reasoning parser (the constraint applies after `</think>`), the Responses API
emits reasoning items, `priority` is honoured, forced tools work as a new user would try them, and
tool_choice auto beside a response format calls a tool or answers in the format."""

import json

import httpx
import jsonschema
import openai
import pytest

from tests.integration.server import start_server

pytestmark = pytest.mark.engine
MESSAGES = [{"role": "user", "content": "Think, then answer."}]
THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 10}},
          "required": ["answer"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("reasoning") / "server.log",
                          env={"CHOIR_REASONING_PARSER": "qwen3", "CHOIR_TOOL_PARSER": "hermes",
                               "CHOIR_ENGINE_ARGS": "--max-model-len 512 --scheduling-policy priority"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rclient(reasoning_server):
    return openai.OpenAI(base_url=f"{reasoning_server.base_url}/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def think_end(reasoning_server) -> int:
    [token] = httpx.post(f"{reasoning_server.base_url}/tokenize",
                         json={"prompt": "</think>", "add_special_tokens": False}).json()["tokens"]
    return token


def chat(rclient, **kwargs):
    return rclient.chat.completions.create(**{"model": "choir-tiny", "messages": MESSAGES, "max_tokens": 12,
                                              "seed": 1, **kwargs})


def test_thinking_on_is_reasoning_and_off_is_content(rclient):
    thinking = chat(rclient, extra_body={"ignore_eos": True}).choices[0].message
    assert thinking.reasoning_content and thinking.content is None  # Qwen3 thinks until </think>
    plain = chat(rclient, extra_body={"ignore_eos": True, **THINKING_OFF}).choices[0].message
    assert plain.content and plain.reasoning_content is None
    streamed = chat(rclient, stream=True, extra_body={"ignore_eos": True, **THINKING_OFF})
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == plain.content
    effort = chat(rclient, reasoning_effort="none", extra_body={"ignore_eos": True}).choices[0].message
    assert effort.content and effort.reasoning_content is None


def test_json_schema_applies_after_the_reasoning(rclient, think_end):
    """The bias makes the model close its reasoning at once; the engine's grammar then starts, so the
    content after `</think>` is valid JSON. Were the grammar applied from the first token (the engine
    not knowing the reasoning parser), `</think>` could never be sampled and all would be reasoning."""
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    choice = chat(rclient, max_tokens=60, response_format=response_format,
                  logit_bias={str(think_end): 100}).choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), ANSWER)


def test_include_reasoning_false_constrains_from_the_first_token(rclient):
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    choice = chat(rclient, max_tokens=60, response_format=response_format,
                  extra_body={"include_reasoning": False}).choices[0]
    assert choice.message.reasoning_content is None
    jsonschema.validate(json.loads(choice.message.content), ANSWER)


def test_usage_counts_reasoning_tokens(rclient):
    usage = chat(rclient, extra_body={"ignore_eos": True}).usage
    assert usage.completion_tokens_details.reasoning_tokens == usage.completion_tokens == 12


def test_responses_emit_reasoning_items(rclient, reasoning_server):
    response = rclient.responses.create(model="choir-tiny", input="Think.", max_output_tokens=8)
    [reasoning] = [item for item in response.output if item.type == "reasoning"]
    assert reasoning.content[0].text and response.usage.output_tokens_details.reasoning_tokens > 0
    events = list(rclient.responses.create(model="choir-tiny", input="Think.", max_output_tokens=8, stream=True))
    types = [event.type for event in events]
    assert "response.reasoning_text.delta" in types and types[-1] in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert deltas == done.text
    kept = rclient.responses.create(model="choir-tiny", input="Think.", max_output_tokens=4, store=True)
    assert kept.store is True  # stored (the server's store is on), and the response says so
    later = rclient.responses.create(model="choir-tiny", max_output_tokens=4, input=[
        {"role": "user", "content": "Think."},
        {"type": "reasoning", "id": reasoning.id, "summary": [], "content": [{"type": "reasoning_text",
                                                                            "text": reasoning.content[0].text}]},
        {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Again."}])
    assert later.status in ("completed", "incomplete")


def test_responses_take_chat_template_kwargs(rclient):
    """As vLLM: thinking off in the template means no reasoning item, only a message."""
    response = rclient.responses.create(model="choir-tiny", input="Think.", max_output_tokens=6,
                                        extra_body=THINKING_OFF)
    assert [item.type for item in response.output] == ["message"] and response.output_text
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    thinking = rclient.responses.create(model="choir-tiny", input="Think.", max_output_tokens=6)
    assert thinking.output[0].type == "reasoning"


def test_responses_errors_name_the_responses_field(rclient):
    with pytest.raises(openai.BadRequestError) as raised:
        rclient.responses.create(model="choir-tiny", input="x", max_output_tokens=600)
    assert raised.value.body["param"] == "max_output_tokens" and "max_output_tokens" in raised.value.body["message"]


def test_priority_is_honoured_under_priority_scheduling(rclient):
    urgent = rclient.completions.create(model="choir-tiny", prompt="x", max_tokens=2, extra_body={"priority": -10})
    assert urgent.choices[0].text is not None


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tools_as_a_new_user_tries_them(rclient, tool_choice):
    """The report: a 512-token context, the default max_tokens, the SDK. Either the call is complete and
    valid, or finish_reason says the length cut it."""
    for seed in range(4):
        choice = rclient.chat.completions.create(model="choir-tiny", messages=MESSAGES, tools=TOOLS, seed=seed,
                                                 tool_choice=tool_choice, extra_body=THINKING_OFF).choices[0]
        if choice.finish_reason == "length":
            continue
        assert choice.finish_reason == ("tool_calls" if tool_choice == "required" else "stop")
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_auto_beside_a_response_format_calls_a_tool_or_answers_in_it(rclient):
    """pydantic-ai's NativeOutput on the real engine: each answer is a hermes call whose arguments follow
    the tool's schema, or content in the response format, never free text."""
    outcomes = set()
    for seed in range(6):
        choice = rclient.chat.completions.create(
            model="choir-tiny", messages=MESSAGES, tools=TOOLS, seed=seed, max_tokens=120, extra_body=THINKING_OFF,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}).choices[0]
        if choice.finish_reason == "length":
            continue
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                assert call.function.name == "get_weather"
                jsonschema.validate(json.loads(call.function.arguments), WEATHER)
            outcomes.add("call")
        else:
            jsonschema.validate(json.loads(choice.message.content), ANSWER)
            outcomes.add("answer")
    assert outcomes, "no seed finished within 120 tokens"


def test_separate_and_stream_reasoning(rclient):
    """SGLang's fields: separate_reasoning false leaves the reasoning in the content; stream_reasoning
    false streams it in one delta."""
    together = chat(rclient, extra_body={"separate_reasoning": False, "ignore_eos": True}).choices[0].message
    assert together.content and not getattr(together, "reasoning_content", None)
    chunks = list(rclient.chat.completions.create(model="choir-tiny", messages=MESSAGES, max_tokens=12, seed=1,
                                                  stream=True, extra_body={"stream_reasoning": False,
                                                                           "ignore_eos": True}))
    reasoning = [c.choices[0].delta.reasoning_content for c in chunks if c.choices[0].delta.reasoning_content]
    assert len(reasoning) == 1


def test_responses_cut_inside_the_reasoning_have_only_the_reasoning_item(rclient):
    """As vLLM's server: no empty message (whole, or content_part / output_text.done events when streamed),
    and no function call whose arguments never began."""
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    for extra in ({}, {"tools": tools, "tool_choice": {"type": "function", "name": "get_weather"}}):
        kwargs = dict(model="choir-tiny", input="Think.", max_output_tokens=4, **extra)
        response = rclient.responses.create(**kwargs)
        assert [item.type for item in response.output] == ["reasoning"]
        events = list(rclient.responses.create(stream=True, **kwargs))
        types = {event.type for event in events}
        assert "response.output_text.done" not in types and "response.function_call_arguments.done" not in types
        assert [item.type for item in events[-1].response.output] == ["reasoning"]
