"""The Responses API on the real engine, through the OpenAI SDK's `responses` client and typed events."""

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.engine


def test_responses_create(client, model):
    response = client.responses.create(model=model, input="Tell me a story.", instructions="Be brief.",
                                       max_output_tokens=12, store=False)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output_text and response.output[0].type == "message"
    assert response.usage.output_tokens <= 12 and response.usage.input_tokens > 0


SMALL = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 8}}, "required": ["word"],
         "additionalProperties": False}


def test_responses_stream_typed_events(client, model):
    """The bundled model never stops by itself; a bounded JSON schema makes it complete."""
    with client.responses.stream(model=model, input="Say a word.", max_output_tokens=200,
                                 text={"format": {"type": "json_schema", "name": "w", "schema": SMALL}}) as stream:
        events = list(stream)
        final = stream.get_final_response()  # the SDK's helper needs response.completed
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    jsonschema.validate(json.loads(final.output_text), SMALL)
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    [done] = [event for event in events if event.type == "response.output_text.done"]
    assert deltas == done.text == final.output_text


def test_responses_create_stream_true(client, model):
    events = list(client.responses.create(model=model, input="Hi", max_output_tokens=4, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == \
        "max_output_tokens"


def test_responses_json_schema_text_format(client, model):
    schema = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 16},
                                               "stars": {"type": "integer", "minimum": 1, "maximum": 5}},
              "required": ["title", "stars"], "additionalProperties": False}
    response = client.responses.create(model=model, input="Rate a film.", max_output_tokens=200,
                                       text={"format": {"type": "json_schema", "name": "rating", "schema": schema}})
    jsonschema.validate(json.loads(response.output_text), schema)


def test_responses_forced_function_call(client, model):
    parameters = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                  "required": ["city"], "additionalProperties": False}
    response = client.responses.create(model=model, input="Weather in Paris?", max_output_tokens=200,
                                       tools=[{"type": "function", "name": "get_weather", "parameters": parameters}],
                                       tool_choice={"type": "function", "name": "get_weather"})
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), parameters)


def test_responses_are_stored_and_continued_through_the_sdk(client, model):
    """OpenAI's default (`store` true): stored, retrieved, continued, listed, deleted, with the SDK's own calls."""
    first = client.responses.create(model=model, input="x", store=True, max_output_tokens=2)
    assert first.status == "incomplete" and first.store is True
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = client.responses.create(model=model, input=[{"role": "user", "content": "y"}, {"role": "user",
                                     "content": "z"}], previous_response_id=first.id, max_output_tokens=2)
    assert second.previous_response_id == first.id and second.usage.input_tokens > first.usage.input_tokens
    items = list(client.responses.input_items.list(second.id, limit=1, order="asc"))  # the SDK pages by `after`
    assert [item.content[0].text for item in items] == ["y", "z"]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model=model, input="x", previous_response_id=first.id, max_output_tokens=2)
    assert raised.value.body["param"] == "previous_response_id"
    assert client.responses.retrieve(second.id).id == second.id  # its own row stays


def test_tool_choice_auto_without_tools(client, model):
    """OpenAI's default tool_choice, sent by SDKs and SGLang's own tests with no tools: a plain answer."""
    response = client.responses.create(model=model, input="Hi", max_output_tokens=3, tool_choice="auto")
    assert response.output[0].type == "message" and response.tool_choice == "auto"


def test_output_text_logprobs(client, model):
    response = client.responses.create(model=model, input="Hi", max_output_tokens=4, top_logprobs=3,
                                       include=["message.output_text.logprobs"])
    [part] = response.output[0].content
    assert len(part.logprobs) == response.usage.output_tokens == 4 and response.top_logprobs == 3
    assert all(len(entry.top_logprobs) == 3 and entry.bytes is not None for entry in part.logprobs)
    events = list(client.responses.create(model=model, input="Hi", max_output_tokens=4, top_logprobs=3, stream=True,
                                          include=["message.output_text.logprobs"]))
    streamed = [lp for event in events if event.type == "response.output_text.delta" for lp in event.logprobs]
    assert len(streamed) == 4 and all(len(lp.top_logprobs) == 3 for lp in streamed)
