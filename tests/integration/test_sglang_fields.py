"""SGLang's request fields on the real engine under the default profile, through the OpenAI SDK's
extra_body (as SGLang's own clients send them), and the default profile's SGLang-shaped answers."""

import json
import re

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.engine
MESSAGES = [{"role": "user", "content": "Hi"}]


def test_regex_and_ebnf_constrain_the_text(client, model):
    regex = client.completions.create(model=model, prompt="x", max_tokens=20, extra_body={"regex": "[ab]{6}"})
    assert re.fullmatch("[ab]{6}", regex.choices[0].text)
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=20,
                                          extra_body={"ebnf": 'root ::= "yes" | "no"'})
    assert chat.choices[0].message.content in ("yes", "no")


def test_completions_json_schema_as_text(client, model):
    schema = {"type": "object", "properties": {"w": {"type": "string", "maxLength": 6}}, "required": ["w"],
              "additionalProperties": False}
    completion = client.completions.create(model=model, prompt="x", max_tokens=60,
                                           extra_body={"json_schema": json.dumps(schema)})
    jsonschema.validate(json.loads(completion.choices[0].text), schema)


def test_two_constraints_are_a_400(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=model, prompt="x", max_tokens=2, extra_body={"regex": "a", "ebnf": "b"})
    assert raised.value.body["param"] == "regex"


def test_no_stop_trim_keeps_the_stop_string(client, model):
    kwargs = dict(model=model, prompt="x", max_tokens=30, seed=3, extra_body={"regex": "ab{10}c{3}"})
    whole = client.completions.create(**kwargs).choices[0].text
    assert whole == "ab" + "b" * 9 + "ccc"
    trimmed = client.completions.create(**kwargs, stop=["bbb"]).choices[0].text
    kept = client.completions.create(**{**kwargs, "extra_body": {**kwargs["extra_body"], "no_stop_trim": True}},
                                     stop=["bbb"]).choices[0].text
    assert (trimmed, kept) == ("a", "abbb")


def test_rid_names_the_response(client, model):
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, extra_body={"rid": "r-77"})
    assert chat.id == "chatcmpl-r-77"


@pytest.mark.parametrize("field, value", [("stop_regex", "a+"), ("return_hidden_states", True),
                                          ("custom_logit_processor", "{}"), ("bootstrap_room", 3)])
def test_what_choir_cannot_serve_is_refused_naming_the_field(client, model, field, value):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, extra_body={field: value})
    assert raised.value.body["param"] == field


def test_a_custom_role_is_a_400(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, max_tokens=2,
                                       messages=[{"role": "my-custom-role", "content": "hi"}])
    assert raised.value.body["param"] == "messages[0].role"


def test_a_token_prompt_is_echoed_without_its_bos(client, model, server):
    tokens = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "The capital"}).json()["tokens"]
    echoed = client.completions.create(model=model, prompt=tokens, max_tokens=1, echo=True).choices[0].text
    assert echoed.startswith("The capital") and "<s>" not in echoed
