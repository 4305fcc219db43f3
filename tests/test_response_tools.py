"""What coding agents (the Codex CLI) send to /v1/responses, over the scripted fake engine: namespace, custom and
hosted tools; calls coming back as output items under the names the client knows; the whole conversation sent
back in `input` (calls, tool outputs, reasoning with Choir's `encrypted_content`)."""

import json

import pytest

from choir.app.serving import reasoning_blob
from tests.test_responses_routes import PATH, collapse, events_of

EXEC = {"type": "function", "name": "exec_command", "description": "Runs a command.", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.", "tools": [
    {"type": "function", "name": "close_agent", "strict": False,
     "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}]}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edits files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
WEB = {"type": "web_search", "external_web_access": False}
# Codex's first request, as captured (shortened): developer and user messages, every kind of tool, no store.
CODEX = {"model": "fake-model", "input": [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
    "tools": [EXEC, NAMESPACE, PATCH, WEB], "tool_choice": "auto", "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"}, "store": False, "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199-thread", "client_metadata": {"x-codex-installation-id": "abc"}}


@pytest.fixture
def long_context(client, fake_engine):
    """The bundled tokenizer and hermes' tool parser, as an agent's server runs (tool_choice `auto`)."""
    from tests.test_parsers_routes import use_parsers

    use_parsers(client, fake_engine, tool="hermes")
    return fake_engine


def offered(fake_engine):
    return {tool["function"]["name"]: tool["function"] for tool in fake_engine.templates[-1].kwargs["tools"]}


def test_codexs_first_request_is_served(client, long_context):
    events = events_of(client, CODEX)
    assert events[-1]["type"] == "response.completed"
    tools = offered(long_context)
    assert list(tools) == ["exec_command", "multi_agent_v1__close_agent", "apply_patch"]  # no hosted web_search
    assert tools["apply_patch"]["parameters"]["required"] == ["input"]
    assert "start: /.+/" in tools["apply_patch"]["description"]  # the grammar is shown to the model
    echoed = events[-1]["response"]["tools"]
    assert [tool["type"] for tool in echoed] == ["function", "namespace", "custom", "web_search"]
    assert echoed[3] == WEB
    whole = client.post(PATH, json=CODEX | {"stream": False})
    assert whole.status_code == 200 and whole.json()["status"] == "completed"


def test_only_hosted_tools_offer_the_model_none(client, long_context):
    response = client.post(PATH, json={"input": "hi", "tools": [WEB, {"type": "image_generation"}],
                                       "tool_choice": "auto"})
    assert response.status_code == 200
    assert "tools" not in long_context.templates[-1].kwargs


def test_a_namespaced_call_comes_back_with_its_namespace(client, long_context):
    long_context.script = lambda prompt, params: ['{"id": ', '"a1"}']
    body = {"input": "close it", "tools": [EXEC, NAMESPACE],
            "tool_choice": {"type": "function", "name": "close_agent", "namespace": "multi_agent_v1"}}
    (call,) = client.post(PATH, json=body).json()["output"]
    assert call["type"] == "function_call" and call["name"] == "close_agent"
    assert call["namespace"] == "multi_agent_v1" and json.loads(call["arguments"]) == {"id": "a1"}
    events = events_of(client, body)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(item["name"], item["namespace"]) for item in done] == [("close_agent", "multi_agent_v1")]
    plain = client.post(PATH, json={"input": "run", "tools": [EXEC],
                                    "tool_choice": {"type": "function", "name": "exec_command"}}).json()["output"]
    assert "namespace" not in plain[0]


def test_a_custom_tool_call_is_a_custom_tool_call_item(client, long_context):
    long_context.script = lambda prompt, params: ['{"input": ', '"*** Begin Patch\\n*** End Patch"}']
    body = {"input": "patch it", "tools": [PATCH], "tool_choice": {"type": "custom", "name": "apply_patch"}}
    (call,) = client.post(PATH, json=body).json()["output"]
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch" and call["id"].startswith("ctc_")
    assert call["input"] == "*** Begin Patch\n*** End Patch" and "arguments" not in call
    events = events_of(client, body)
    assert collapse([e["type"] for e in events]) == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.custom_tool_call_input.done", "response.output_item.done", "response.completed"]
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == "*** Begin Patch\n*** End Patch"
    assert events[-1]["response"]["output"][0]["input"] == done["input"]


@pytest.mark.parametrize(("choice", "says"), [
    ({"type": "custom", "name": "exec_command"}, "custom tool `exec_command`"),
    ({"type": "function", "name": "apply_patch"}, "function tool `apply_patch`"),
    ({"type": "function", "name": "close_agent"}, "function tool `close_agent`"),  # its namespace left out
    ({"type": "function", "name": "nope", "namespace": "multi_agent_v1"}, "`multi_agent_v1__nope`"),
])
def test_a_tool_choice_naming_no_offered_tool_is_a_400(client, choice, says):
    response = client.post(PATH, json={"input": "x", "tools": [EXEC, NAMESPACE, PATCH], "tool_choice": choice})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tool_choice" and says in error["message"]


def test_the_conversation_sent_back_reaches_the_template(client, long_context):
    """Codex keeps nothing on the server: every later turn sends the calls, their outputs and the reasoning."""
    client.post(PATH, json={"input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": None,
         "encrypted_content": reasoning_blob.encode("I should look first.")},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "close_agent",
         "namespace": "multi_agent_v1", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "closed"}, {"type": "input_text", "text": "."}]},
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "c2", "name": "apply_patch", "input": "*** Begin"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "c3", "status": "completed",
         "action": {"type": "exec", "command": ["ls"]}},
        {"type": "local_shell_call_output", "id": "c3", "output": "a.txt"}],
        "tools": [NAMESPACE, PATCH]})
    messages = long_context.conversations[-1]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    assert messages[1]["reasoning"] == "I should look first."
    assert messages[1]["tool_calls"][0]["function"] == {"name": "multi_agent_v1__close_agent", "arguments": "{}"}
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "closed."}
    assert json.loads(messages[3]["tool_calls"][0]["function"]["arguments"]) == {"input": "*** Begin"}
    assert messages[4]["content"] == "Done!" and messages[4]["tool_call_id"] == "c2"
    assert messages[5]["tool_calls"][0]["function"]["name"] == "local_shell"
    assert json.loads(messages[5]["tool_calls"][0]["function"]["arguments"])["command"] == ["ls"]
    assert messages[6] == {"role": "tool", "tool_call_id": "c3", "content": "a.txt"}


def test_reasoning_given_out_encrypted_comes_back_whole(client, long_context):
    from tests.test_parsers_routes import THOUGHT, token_pieces, use_parsers

    use_parsers(client, long_context, reasoning="deepseek_r1", tool="hermes")
    long_context.script = lambda prompt, params: token_pieces(THOUGHT + "Answer.")
    body = {"input": "hi", "include": ["reasoning.encrypted_content"], "store": False}
    reasoning = client.post(PATH, json=body).json()["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"].startswith(reasoning_blob.PREFIX)
    streamed = [e["item"] for e in events_of(client, body) if e["type"] == "response.output_item.done"]
    assert reasoning_blob.decode(streamed[0]["encrypted_content"]) == "The user wants weather."
    assert "encrypted_content" not in client.post(PATH, json={"input": "hi"}).json()["output"][0]
    again = {"type": "reasoning", "id": reasoning["id"], "summary": [], "encrypted_content":
             reasoning["encrypted_content"]}
    response = client.post(PATH, json={"input": [{"role": "user", "content": "hi"}, again,
                                                 {"role": "assistant", "content": "Answer."},
                                                 {"role": "user", "content": "more"}]})
    assert response.status_code == 200
    assert long_context.conversations[-1][1]["reasoning"] == "The user wants weather."


@pytest.mark.parametrize("blob", ["gAAAAABo-openai-encrypted", reasoning_blob.PREFIX + "not-base64!",
                                  reasoning_blob.PREFIX + "eJwrycjMy87MS1fI"])
def test_encrypted_content_choir_cannot_read_is_a_400_naming_the_item(client, blob):
    response = client.post(PATH, json={"input": [{"role": "user", "content": "hi"},
                                                 {"type": "reasoning", "summary": [], "encrypted_content": blob}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input[1].encrypted_content" and "cannot read" in error["message"]


def test_a_null_encrypted_content_is_no_reasoning(client, long_context):
    response = client.post(PATH, json={"input": [{"role": "user", "content": "hi"},
                                                 {"type": "reasoning", "summary": [], "encrypted_content": None}]})
    assert response.status_code == 200


@pytest.mark.parametrize(("item", "param"), [
    ({"type": "custom_tool_call", "call_id": "c", "name": "x"}, "input[0]"),
    ({"type": "custom_tool_call_output", "call_id": "c", "output": 3}, "input[0]"),
    ({"type": "function_call_output", "call_id": "c", "output": [{"type": "output_text", "text": "x"}]}, "input[0]"),
    ({"type": "local_shell_call", "call_id": "c", "action": {"type": "exec"}}, "input[0]"),
    ({"type": "web_search_call", "id": "ws"}, "input[0].type"),
])
def test_a_malformed_item_is_a_400_naming_it(client, item, param):
    response = client.post(PATH, json={"input": [item]})
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_accepted_fields_are_not_unknown(client, caplog):
    """prompt_cache_key, client_metadata and OpenAI's other request fields decode as known fields."""
    response = client.post(PATH, json={"input": "hi", "prompt_cache_key": "k", "client_metadata": {"a": "b"},
                                       "safety_identifier": "u", "service_tier": "auto",
                                       "prompt_cache_retention": "24h", "max_tool_calls": 2})
    assert response.status_code == 200
    assert "unknown" not in caplog.text.lower()


def test_a_prompt_cache_key_keeps_a_conversation_on_one_data_parallel_rank(client, fake_engine):
    import zlib

    fake_engine.data_parallel_size = 4
    for key in ("thread-a", "thread-b", "thread-c"):
        client.post(PATH, json={"input": "hi", "prompt_cache_key": key})
        client.post(PATH, json={"input": "again", "prompt_cache_key": key, "stream": True})
        ranks = {call.options.data_parallel_rank for call in fake_engine.calls[-2:]}
        assert ranks == {zlib.crc32(key.encode()) % 4}
    client.post(PATH, json={"input": "no key"})
    assert fake_engine.calls[-1].options.data_parallel_rank is None


def test_the_servers_default_template_kwargs_reach_the_template_and_parsers(fake_engine):
    from litestar.testing import TestClient

    from choir.app.asgi import create_app
    from choir.core.settings import Settings
    from tests.fakes import fake_engine_factory

    app = create_app(Settings(served_model_name="fake-model", default_chat_template_kwargs={"thinking": True,
                                                                                            "x": 1}),
                     engine_factory=fake_engine_factory(fake_engine))
    with TestClient(app) as client:
        client.post(PATH, json={"input": "hi", "chat_template_kwargs": {"x": 2}})
        assert fake_engine.templates[-1].kwargs == {"thinking": True, "x": 2}  # the request's own win


def test_a_custom_tool_call_cut_short_is_incomplete_with_what_it_said(client, long_context):
    long_context.script = lambda prompt, params: ['{"input": ', '"*** Begin Patch', "\\n*** Upd", "ate File"]
    body = {"input": "patch it", "tools": [PATCH], "tool_choice": {"type": "custom", "name": "apply_patch"},
            "max_output_tokens": 3}
    response = client.post(PATH, json=body).json()
    (call,) = response["output"]
    assert response["status"] == "incomplete" and call["status"] == "incomplete"
    assert call["input"].startswith("*** Begin Patch") and not call["input"].startswith("{")
    events = events_of(client, body)
    done = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert done["status"] == "incomplete" and not done["input"].startswith("{")


@pytest.mark.parametrize(("tools", "param", "says"), [
    ([{"type": "function", "name": "fs__read"}, {"type": "namespace", "name": "fs", "tools": [
        {"type": "custom", "name": "read"}]}], "tools[1].tools[0].name", "Two tools are offered"),
    ([EXEC, EXEC], "tools[1].name", "Two tools are offered"),
    ([{"type": "namespace", "name": "n" * 40, "tools": [{"type": "function", "name": "f" * 40}]}],
     "tools[0].tools[0].name", "longer than 64"),
])
def test_tools_the_model_could_not_tell_apart_are_a_400(client, tools, param, says):
    response = client.post(PATH, json={"input": "x", "tools": tools})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"]


def test_encrypted_reasoning_is_bounded_per_request(client, long_context):
    big = reasoning_blob.encode("a" * (5 * 1024 * 1024))  # 5 MiB of text in a few KB
    assert len(big) < 20_000
    items = [{"role": "user", "content": "hi"}, {"type": "reasoning", "summary": [], "encrypted_content": big},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    assert client.post(PATH, json={"input": items, "max_output_tokens": 1}).status_code == 200
    twice = [*items, {"type": "reasoning", "summary": [], "encrypted_content": big}]
    response = client.post(PATH, json={"input": twice})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input[4].encrypted_content"


@pytest.mark.parametrize("path", [PATH, "/v1/conversations"])
def test_an_item_type_that_is_not_a_string_is_a_400(client, path):
    body = {"input": [{"type": []}]} if path == PATH else {"items": [{"type": {}}]}
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
