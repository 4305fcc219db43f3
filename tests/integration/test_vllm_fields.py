"""vLLM's request fields on the real engine through the OpenAI SDK (`extra_body`, as a vLLM user sends
them): each honoured one changes what the engine does, each refused one is a 400 naming it, and
/tokenize and /detokenize agree with what generation sees."""

import re

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.engine
MESSAGES = [{"role": "user", "content": "Say something."}]
FREE = {"ignore_eos": True}  # the random model would run to max_tokens anyway; this makes it certain


def tokens_of(server, text: str) -> list[int]:
    reply = httpx.post(f"{server.base_url}/tokenize", json={"prompt": text, "add_special_tokens": False})
    return reply.json()["tokens"]


def generated_ids(client, model, **extra):
    completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, seed=3,
                                           extra_body={**FREE, "return_token_ids": True, **extra})
    return completion.choices[0].token_ids, completion


def test_logit_bias_forces_a_token(client, model, server):
    [token] = tokens_of(server, " fox")  # one token of the bundled vocabulary
    ids, completion = generated_ids(client, model)
    assert set(ids) != {token}
    biased, _ = generated_ids(client, model, logit_bias={str(token): 100})
    assert biased == [token] * 12
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, logit_bias={str(token): 100},
                                          extra_body=FREE)
    assert chat.choices[0].message.content == " fox" * 6


def test_allowed_token_ids_and_bad_words(client, model, server):
    allowed = tokens_of(server, "red green blue")
    ids, _ = generated_ids(client, model, allowed_token_ids=allowed)
    assert ids and set(ids) <= set(allowed)
    # vLLM bans a bad word's tokens with and without a leading space (" upon" and "upon" are one token each).
    [upon] = tokens_of(server, " upon")
    forced, _ = generated_ids(client, model, logit_bias={str(upon): 100})
    assert set(forced) == {upon}
    banned, completion = generated_ids(client, model, logit_bias={str(upon): 100}, bad_words=["upon"])
    assert upon not in banned and "upon" not in completion.choices[0].text  # a bad word beats any bias


@pytest.mark.parametrize("constraint, check", [
    ({"regex": "(yes|no)-[0-9]{3}"}, lambda text: re.fullmatch("(yes|no)-[0-9]{3}", text)),
    ({"choice": ["alpha", "beta", "gamma"]}, lambda text: text in ("alpha", "beta", "gamma")),
    ({"grammar": 'root ::= "ab" ("c" | "d")'}, lambda text: text in ("abc", "abd")),
])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_structured_outputs_constrain_the_text(client, model, constraint, check, endpoint):
    extra = {"structured_outputs": constraint}
    if endpoint == "chat":
        text = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=30, seed=1,
                                              extra_body=extra).choices[0].message.content
    else:
        text = client.completions.create(model=model, prompt="Answer:", max_tokens=30, seed=1,
                                         extra_body=extra).choices[0].text
    assert check(text), text


def test_structured_outputs_json_and_completions_response_format(client, model):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    import json

    for extra in ({"structured_outputs": {"json": schema}},
                  {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}):
        choice = client.completions.create(model=model, prompt="JSON:", max_tokens=40, seed=2,
                                           extra_body=extra).choices[0]
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.text), schema)


def test_an_invalid_regex_is_a_bad_request(client, model):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="x", max_tokens=5, extra_body={"structured_outputs": {
            "regex": "(unclosed"}})


def test_return_token_ids_agree_with_the_tokenizer_and_usage(client, model, server):
    completion = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=7,
                                           extra_body={**FREE, "return_token_ids": True})
    choice = completion.choices[0]
    assert choice.prompt_token_ids == httpx.post(f"{server.base_url}/tokenize",
                                                 json={"prompt": "The quick brown fox"}).json()["tokens"]
    assert len(choice.token_ids) == completion.usage.completion_tokens == 7
    text = httpx.post(f"{server.base_url}/detokenize", json={"tokens": choice.token_ids}).json()["prompt"]
    assert text == choice.text
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4,
                                          extra_body={**FREE, "return_token_ids": True})
    assert chat.prompt_token_ids == httpx.post(f"{server.base_url}/tokenize",
                                               json={"messages": MESSAGES}).json()["tokens"]
    assert len(chat.choices[0].token_ids) == 4


def test_tokens_as_token_ids_and_chat_prompt_logprobs(client, model):
    completion = client.completions.create(model=model, prompt="Hello", max_tokens=4, logprobs=1,
                                           extra_body={**FREE, "return_token_ids": True,
                                                       "return_tokens_as_token_ids": True})
    choice = completion.choices[0]
    assert choice.logprobs.tokens == [f"token_id:{i}" for i in choice.token_ids]
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2,
                                          extra_body={"prompt_logprobs": 1})
    positions = chat.prompt_logprobs
    assert len(positions) == chat.usage.prompt_tokens and positions[0] is None
    assert all(entry["logprob"] <= 0 for position in positions[1:] for entry in position.values())


def test_best_of_keeps_the_likeliest_candidate(client, model):
    kwargs = dict(model=model, prompt="A tale", max_tokens=8, seed=40, extra_body=FREE)
    candidates = client.completions.create(n=4, logprobs=0, **kwargs).choices
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in candidates]
    best = client.completions.create(n=1, best_of=4, **kwargs)  # an OpenAI SDK parameter
    assert best.choices[0].text == candidates[means.index(max(means))].text
    assert best.usage.completion_tokens == 4 * 8 and best.choices[0].logprobs is None


def test_truncation_and_request_id(client, model, server):
    completion = client.completions.create(model=model, prompt="one two three four five six seven", max_tokens=2,
                                           extra_body={"truncate_prompt_tokens": 3, "request_id": "body-id"})
    assert completion.usage.prompt_tokens == 3 and completion.id == "cmpl-body-id"


def test_cache_salt_keeps_prefixes_apart(client, model):
    prompt = "A long shared prefix. " * 40

    def cached(**extra):
        usage = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body=extra).usage
        return usage.prompt_tokens_details.cached_tokens

    cached()
    assert cached() > 0  # the prefix cache held the prompt the second time
    assert cached(cache_salt="tenant-a") == 0  # a salted prompt shares no cache with the unsalted one
    assert cached(cache_salt="tenant-a") > 0


@pytest.mark.parametrize("extra, param", [
    ({"priority": 5}, "priority"),  # this server schedules first come, first served
    ({"use_beam_search": True}, "use_beam_search"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"logit_bias": {"fox": 1}}, "logit_bias"),
    ({"best_of": 2, "n": 3}, "best_of"),
    ({"cache_salt": "a/b"}, "cache_salt"),
])
def test_refused_fields_are_400s_naming_them(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=model, prompt="x", max_tokens=2, extra_body=extra)
    assert raised.value.body["param"] == param


def test_unknown_fields_and_obfuscation_option_are_accepted(client, model, server):
    stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, stream=True,
                                            stream_options={"include_usage": True, "include_obfuscation": True},
                                            extra_body={"frobnicate": True})
    assert list(stream)[-1].usage.completion_tokens == 2
    assert "request fields ignored" in server.log() and "frobnicate" in server.log()


def test_tokenizer_routes(server):
    base = server.base_url
    tokenized = httpx.post(f"{base}/tokenize", json={"prompt": "hello world", "return_token_strs": True}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) == len(tokenized["token_strs"])
    assert tokenized["max_model_len"] == 2048 and tokenized["token_strs"][0] == "<s>"
    assert httpx.post(f"{base}/detokenize", json={"tokens": tokenized["tokens"]}).json()["prompt"] == \
        "<s>hello world"
    out_of_vocabulary = httpx.post(f"{base}/detokenize", json={"tokens": [1, 10**7]})
    assert out_of_vocabulary.status_code == 400 and out_of_vocabulary.json()["error"]["param"] == "tokens[1]"
    chat = httpx.post(f"{base}/tokenize", json={"messages": MESSAGES}).json()
    usage = httpx.post(f"{base}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1}).json()["usage"]
    assert chat["count"] == usage["prompt_tokens"]
    # As vLLM: the tokenizer adds its bos to the rendered template (which writes its own): one more token.
    special = httpx.post(f"{base}/tokenize", json={"messages": MESSAGES, "add_special_tokens": True}).json()
    assert special["tokens"] == [tokenized["tokens"][0], *chat["tokens"]]
    usage = httpx.post(f"{base}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1,
                                                           "add_special_tokens": True}).json()["usage"]
    assert usage["prompt_tokens"] == special["count"]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_minus_one_logprobs_is_the_whole_vocabulary_within_max_logprobs(client, model, endpoint):
    """vLLM's -1: every token's logprob. The engine's --max-logprobs (20 by default) bounds it: a 400
    naming `logprobs`, as vLLM's server says it (before the stream starts, where vLLM sends it inside)."""
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as raised:
            if endpoint == "chat":
                list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                                    max_tokens=2, logprobs=True, top_logprobs=-1, stream=stream)
                     if stream else [client.chat.completions.create(
                         model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2, logprobs=True,
                         top_logprobs=-1)])
            else:
                client.completions.create(model=model, prompt="x", max_tokens=2, logprobs=-1, stream=stream)
        assert raised.value.body["param"] == "logprobs" and "max allowed: 20" in raised.value.body["message"]
