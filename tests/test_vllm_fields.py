"""vLLM's request fields over a recording fake engine: each honoured field reaches the engine as vLLM's
server would pass it, each refused one is a 400 naming it, and the answer carries what was asked."""

import pytest

from choir.app.serving.json_bounds import bounded_integers
from choir.app.serving.unserved import CHAT_UNSERVED, UNSERVED
from tests.sse import sse_json

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
BODIES = {CMPL: {"prompt": "hi"}, CHAT: {"messages": MESSAGES}}
BOTH = pytest.mark.parametrize("path", [CMPL, CHAT])


def error(response, param):
    assert response.status_code == 400, response.text
    body = response.json()["error"]
    assert body["param"] == param and set(body) == {"message", "type", "param", "code"}
    return body["message"]


@BOTH
@pytest.mark.parametrize("field, value, attribute, expected", [
    ("logit_bias", {"7": 5.5, "12": -100}, "logit_bias", {7: 5.5, 12: -100.0}),
    ("allowed_token_ids", [4, 5, 6], "allowed_token_ids", [4, 5, 6]),
    ("bad_words", ["foo", "bar baz"], "bad_words", ["foo", "bar baz"]),
    ("spaces_between_special_tokens", False, "spaces_between_special_tokens", False),
    ("stream_interval", 4, "stream_interval", 4),
    ("thinking_token_budget", 32, "thinking_token_budget", 32),
    ("thinking_token_budget", -1, "thinking_token_budget", None),  # -1: unlimited
    ("vllm_xargs", {"custom": 1}, "extra_args", {"custom": 1}),
])
def test_sampling_fields_reach_the_engine(client, fake_engine, path, field, value, attribute, expected):
    assert client.post(path, json={**BODIES[path], field: value}).status_code == 200
    assert getattr(fake_engine.calls[0].params, attribute) == expected


@BOTH
def test_repetition_detection_reaches_the_engine(client, fake_engine, path):
    body = {**BODIES[path], "repetition_detection": {"max_pattern_size": 4, "min_pattern_size": 2, "min_count": 3}}
    assert client.post(path, json=body).status_code == 200
    detection = fake_engine.calls[0].params.repetition_detection
    assert (detection.max_pattern_size, detection.min_pattern_size, detection.min_count) == (4, 2, 3)


def test_logprob_token_ids_are_the_logprobs_returned(client, fake_engine):
    body = {**BODIES[CMPL], "logprobs": 2, "logprob_token_ids": [5, 9]}
    assert client.post(CMPL, json=body).status_code == 200
    params = fake_engine.calls[0].params
    assert params.logprob_token_ids == [5, 9] and params.logprobs is None  # vLLM's rule: the ids replace the top


@BOTH
@pytest.mark.parametrize("field, value, param", [
    ("logit_bias", {"a": 1}, "logit_bias"),
    ("logit_bias", {"-3": 1}, "logit_bias"),
    ("logit_bias", {"1.5": 1}, "logit_bias"),
    ("logit_bias", {"5": 101}, "logit_bias"),
    ("allowed_token_ids", [], "allowed_token_ids"),
    ("allowed_token_ids", [-1], "allowed_token_ids[0]"),
    ("bad_words", [""], "bad_words[0]"),
    ("logprob_token_ids", [1], "logprob_token_ids"),  # without logprobs
    ("cache_salt", "a/b", "cache_salt"),
    ("cache_salt", "x" * 129, "cache_salt"),
    ("cache_salt", "", "cache_salt"),
    ("truncation_side", "left", "truncation_side"),  # without truncate_prompt_tokens
    ("truncate_prompt_tokens", -2, "truncate_prompt_tokens"),
    ("priority", 1, "priority"),  # without priority scheduling
    ("best_of", 0, "best_of"),
    ("structured_outputs", {}, "structured_outputs"),
    ("structured_outputs", {"regex": "a+", "choice": ["a"]}, "structured_outputs"),
    ("structured_outputs", {"json_object": False}, "structured_outputs.json_object"),
    ("structured_outputs", {"choice": []}, "structured_outputs.choice"),
    ("structured_outputs", {"regex": "a", "disable_any_whitespace": True}, "structured_outputs.disable_any_whitespace"),
    ("structured_outputs", {"regex": "a", "bogus": 1}, "structured_outputs"),
    ("guided_json", {"type": "object"}, "guided_json"),
    ("guided_choice", ["a"], "guided_choice"),
])
def test_invalid_vllm_fields_are_400s_naming_them(client, fake_engine, path, field, value, param):
    body = {**BODIES[path], field: value}
    if field == "logprob_token_ids" and path == CHAT:
        body["logprobs"] = False
    error(client.post(path, json=body), param)
    assert fake_engine.calls == []


def test_guided_fields_name_their_replacement_in_every_profile():
    from tests.test_compat import make_client

    for profile in ("sglang", "vllm"):
        with make_client(profile) as client:
            message = error(client.post(CHAT, json={"messages": MESSAGES, "guided_regex": "a+"}), "guided_regex")
            assert "structured_outputs" in message


@BOTH
@pytest.mark.parametrize("field", sorted(UNSERVED))
def test_unserved_fields_are_refused_unless_default(client, fake_engine, path, field):
    default, _ = UNSERVED[field]
    if field == "prompt_embeds" and path == CHAT:
        return  # a completions field
    assert client.post(path, json={**BODIES[path], field: default}).status_code == 200
    other = {"use_beam_search": True, "length_penalty": 0.5, "prompt_embeds": "AAAA", "kv_transfer_params": {"a": 1},
             "ec_transfer_params": {"a": 1}, "routed_experts_prompt_start": 3, "return_token_offsets": True,
             "mm_payload": "none", "return_mm_kwargs": True, "stop_regex": "a+", "session_params": {"id": "s"},
             "custom_logit_processor": "{}", "custom_params": {"a": 1}, "return_hidden_states": "last",
             "return_routed_experts": True, "return_cached_tokens_details": True, "ngram_corpus_id": "c",
             "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 2, "disagg_prefill_dp_rank": 0,
             "routed_dp_rank": 1, "data_parallel_rank": 1}[field]
    message = error(client.post(path, json={**BODIES[path], field: other}), field)
    assert "not supported" in message


@pytest.mark.parametrize("field", sorted(CHAT_UNSERVED))
def test_chat_only_unserved_fields_are_refused_unless_default(client, field):
    default, _ = CHAT_UNSERVED[field]
    assert client.post(CHAT, json={**BODIES[CHAT], field: default}).status_code == 200
    other = {"echo": True, "chat_template": "{{ messages }}", "media_io_kwargs": {"a": 1},
             "mm_processor_kwargs": {"a": 1}, "return_prompt_text": True, "input_ids": [1, 2],
             "return_prompt_token_ids": True, "return_meta_info": True, "max_dynamic_patch": 4,
             "min_dynamic_patch": 1}[field]
    error(client.post(CHAT, json={**BODIES[CHAT], field: other}), field)


@BOTH
@pytest.mark.parametrize("constraint", [{"json": {"type": "object"}}, {"regex": "[ab]+"}, {"choice": ["yes", "no"]},
                                        {"grammar": 'root ::= "a"'}, {"json_object": True},
                                        {"structural_tag": '{"type": "structural_tag"}'}])
def test_structured_outputs_reach_the_engine(client, fake_engine, path, constraint):
    assert client.post(path, json={**BODIES[path], "structured_outputs": constraint}).status_code == 200
    params = fake_engine.calls[0].params.structured_outputs
    [(kind, value)] = constraint.items()
    assert getattr(params, kind) == value


@BOTH
def test_structured_outputs_and_response_format_cannot_both_constrain(client, path):
    body = {**BODIES[path], "structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}
    error(client.post(path, json=body), "structured_outputs")


def test_structured_outputs_cannot_join_a_forced_tool(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {**BODIES[CHAT], "tools": tools, "tool_choice": "required", "structured_outputs": {"regex": "a"}}
    error(client.post(CHAT, json=body), "structured_outputs")


def test_completions_take_response_format(client, fake_engine):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    assert client.post(CMPL, json=body).status_code == 200
    # an integer the schema leaves unbounded gets JSON's safe range (choir/app/serving/json_bounds.py)
    assert fake_engine.calls[0].params.structured_outputs.json == bounded_integers(schema)


@BOTH
def test_how_prompts_are_tokenized(client, fake_engine, path):
    body = {**BODIES[path], "cache_salt": "tenant-7", "truncate_prompt_tokens": 5, "truncation_side": "left"}
    assert client.post(path, json=body).status_code == 200
    [render] = fake_engine.renders
    assert (render.cache_salt, render.truncate_prompt_tokens, render.truncation_side) == ("tenant-7", 5, "left")
    assert render.add_special_tokens == (path == CMPL)  # a chat template writes its own
    assert client.post(path, json={**BODIES[path], "add_special_tokens": path == CHAT}).status_code == 200
    assert fake_engine.renders[-1].add_special_tokens == (path == CHAT)


def test_truncate_to_what_leaves_room_for_the_output(client, fake_engine):
    assert client.post(CMPL, json={"prompt": "hi", "truncate_prompt_tokens": -1, "max_tokens": 10}).status_code == 200
    assert fake_engine.renders[0].truncate_prompt_tokens == fake_engine.max_model_len - 10


@BOTH
def test_priority_and_session_reach_the_engine_under_priority_scheduling(client, fake_engine, path):
    fake_engine.priority_scheduling = True
    body = {**BODIES[path], "priority": -5, "session_id": "conversation-1", "n": 2}
    assert client.post(path, json=body).status_code == 200
    assert [(c.options.priority, c.options.session_id) for c in fake_engine.calls] == [(-5, "conversation-1")] * 2


@BOTH
def test_request_id_names_the_response_unless_the_header_does(client, path):
    assert client.post(path, json={**BODIES[path], "request_id": "mine"}).json()["id"].endswith("-mine")
    headed = client.post(path, json={**BODIES[path], "request_id": "mine"}, headers={"X-Request-Id": "hdr"})
    assert headed.json()["id"].endswith("-hdr")


def test_best_of_returns_the_likeliest_candidates(client, fake_engine):
    """Candidates are seeded seed + i; here candidate i's mean logprob is -i / 10 - 1 except that seed 12
    (candidate 2) is made the likeliest."""
    original = fake_engine.generate

    async def generate(prompt, params, request_id, options):
        async for output in original(prompt, params, request_id, options):
            completion = output.outputs[0]
            rank = params.seed - 10
            mean = 0.0 if rank == 2 else -rank / 10 - 1
            completion.cumulative_logprob = mean * len(completion.token_ids)
            completion.text = f"candidate {rank}"
            yield output

    fake_engine.generate = generate
    body = client.post(CMPL, json={"prompt": "x", "n": 2, "best_of": 4, "seed": 10}).json()
    assert len(fake_engine.calls) == 4 and [c.params.seed for c in fake_engine.calls] == [10, 11, 12, 13]
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "candidate 2"), (1, "candidate 0")]
    assert all(c["logprobs"] is None for c in body["choices"])  # ranked by logprobs nobody asked to see
    assert body["usage"]["completion_tokens"] == 4 * 12  # every candidate's tokens were generated


@BOTH
def test_best_of_is_refused_below_n_and_with_stream(client, path):
    assert "at least n" in error(client.post(path, json={**BODIES[path], "n": 3, "best_of": 2}), "best_of")
    error(client.post(path, json={**BODIES[path], "best_of": 2, "stream": True}), "best_of")
    assert client.post(path, json={**BODIES[path], "n": 2, "best_of": 2}).status_code == 200  # nothing to choose


def test_completion_token_ids_and_prompt_logprobs(client, fake_engine):
    body = client.post(CMPL, json={"prompt": "hi", "max_tokens": 2, "return_token_ids": True,
                                   "prompt_logprobs": 1}).json()
    [choice] = body["choices"]
    assert choice["prompt_token_ids"] == fake_engine.calls[0].prompt.token_ids
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"]
    prompt_logprobs = choice["prompt_logprobs"]
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(choice["prompt_token_ids"])
    assert all(set(entry) == {"logprob", "rank", "decoded_token"} for p in prompt_logprobs[1:] for entry in p.values())
    assert fake_engine.calls[0].params.prompt_logprobs == 1
    plain = client.post(CMPL, json={"prompt": "hi"}).json()["choices"][0]
    assert not {"token_ids", "prompt_token_ids", "prompt_logprobs"} & set(plain)  # only when asked


def test_streamed_completion_token_ids(client):
    chunks, done = sse_json(client.post(CMPL, json={"prompt": "hi", "n": 2, "return_token_ids": True,
                                                    "stream": True}).text)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "prompt_token_ids" in mine[0] and not any("prompt_token_ids" in c for c in mine[1:])
        assert sum(len(c["token_ids"]) for c in mine) == 12


def test_chat_token_ids_and_prompt_logprobs(client, fake_engine):
    body = client.post(CHAT, json={"messages": MESSAGES, "return_token_ids": True, "prompt_logprobs": 0}).json()
    assert body["prompt_token_ids"] == fake_engine.calls[0].prompt.token_ids
    assert len(body["choices"][0]["token_ids"]) == body["usage"]["completion_tokens"]
    assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) == len(body["prompt_token_ids"])
    chunks, _ = sse_json(client.post(CHAT, json={"messages": MESSAGES, "return_token_ids": True,
                                                 "stream": True}).text)
    assert chunks[0]["prompt_token_ids"] == body["prompt_token_ids"]
    assert sum(len(c["choices"][0].get("token_ids", [])) for c in chunks) == body["usage"]["completion_tokens"]
    error(client.post(CHAT, json={"messages": MESSAGES, "prompt_logprobs": 1, "stream": True}), "prompt_logprobs")


def test_tokens_as_token_ids(client):
    choice = client.post(CMPL, json={"prompt": "hi", "logprobs": 1, "return_tokens_as_token_ids": True,
                                     "return_token_ids": True}).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{i}" for i in choice["token_ids"]]
    assert all(key.startswith("token_id:") for top in logprobs["top_logprobs"] for key in top)
    assert logprobs["text_offset"] == list(range(len("Hello world!")))  # still offsets into the text
    content = client.post(CHAT, json={"messages": MESSAGES, "logprobs": True, "top_logprobs": 1,
                                      "return_tokens_as_token_ids": True}).json()["choices"][0]["logprobs"]["content"]
    assert content[0]["token"].startswith("token_id:") and bytes(content[0]["bytes"]) == b"H"  # the text's bytes
    assert content[0]["top_logprobs"][0]["token"].startswith("token_id:")


@BOTH
def test_cached_prompt_tokens_are_reported_once_per_prompt(client, fake_engine, path):
    fake_engine.cached_tokens = 2
    usage = client.post(path, json={**BODIES[path], "n": 3}).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 2}
    chunks, _ = sse_json(client.post(path, json={**BODIES[path], "n": 2, "stream": True,
                                                 "stream_options": {"include_usage": True}}).text)
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}


def test_reasoning_effort_and_documents_reach_the_chat_template(client, fake_engine):
    documents = [{"title": "a", "text": "b"}]
    client.post(CHAT, json={"messages": MESSAGES, "reasoning_effort": "none", "documents": documents})
    kwargs = fake_engine.templates[-1].kwargs
    assert kwargs["reasoning_effort"] == "none" and kwargs["enable_thinking"] is False
    assert kwargs["documents"] == documents
    client.post(CHAT, json={"messages": MESSAGES, "reasoning_effort": "low",
                            "chat_template_kwargs": {"enable_thinking": False}})
    assert fake_engine.templates[-1].kwargs["enable_thinking"] is False  # the request's own kwargs win


@BOTH
def test_stream_options_include_obfuscation_is_accepted(client, path):
    response = client.post(path, json={**BODIES[path], "stream": True,
                                       "stream_options": {"include_usage": True, "include_obfuscation": False}})
    assert response.status_code == 200 and sse_json(response.text)[1] == 1


def test_server_defaults_of_vllms_front_end_flags():
    """CHOIR_RETURN_TOKENS_AS_TOKEN_IDS and CHOIR_FORCE_INCLUDE_USAGE: vLLM's --return-tokens-as-token-ids and
    --enable-force-include-usage. A request's own return_tokens_as_token_ids still wins."""
    from litestar.testing import TestClient

    from choir.app.asgi import create_app
    from choir.core.settings import Settings
    from tests.fakes import FakeEngine, fake_engine_factory

    settings = Settings(served_model_name="fake-model", return_tokens_as_token_ids=True, force_include_usage=True)
    with TestClient(create_app(settings, engine_factory=fake_engine_factory(FakeEngine()))) as client:
        tokens = client.post(CMPL, json={"prompt": "x", "logprobs": 0}).json()["choices"][0]["logprobs"]["tokens"]
        assert tokens and all(token.startswith("token_id:") for token in tokens)
        own = client.post(CMPL, json={"prompt": "x", "logprobs": 0, "return_tokens_as_token_ids": False}).json()
        assert not own["choices"][0]["logprobs"]["tokens"][0].startswith("token_id:")
        for path in (CMPL, CHAT):
            chunks, _ = sse_json(client.post(path, json={**BODIES[path], "stream": True}).text)
            assert all(chunk["usage"] is not None for chunk in chunks) and chunks[-1]["choices"] == []
    for name in ("CHOIR_RETURN_TOKENS_AS_TOKEN_IDS", "CHOIR_FORCE_INCLUDE_USAGE"):
        with pytest.raises(Exception, match=name):
            Settings.from_env({name: "maybe"})
