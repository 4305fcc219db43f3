"""tool_choice auto and reasoning through vLLM's own parsers (hermes, deepseek_r1), over a scripted fake
engine whose token ids come from the bundled model's tokenizer. Scripts are cut at every position:
the assembled stream must equal the whole answer, and no marker text may leak into content."""

import json
from functools import cache

import pytest

from choir.core.settings import BUNDLED_MODEL_DIR
from choir.plugins.engine.config import EngineConfig
from tests.sse import sse_json

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "weather?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THOUGHT = "<think>The user wants weather.</think>"


@cache
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_DIR))


def use_parsers(client, engine, reasoning=None, tool=None):
    """As choir/plugins/parsers.py does at start-up, with the bundled tokenizer."""
    engine.tokenizer = tokenizer()
    engine.max_model_len = 4096
    client.app.state[EngineConfig().parsers_state_key] = engine.parsers(reasoning, tool)


def script(*pieces):
    return lambda prompt, params: list(pieces)


def token_pieces(text):
    """The text one token per piece, as the engine streams it."""
    ids = tokenizer().encode(text, add_special_tokens=False)
    return [tokenizer().decode([i]) for i in ids]


def assemble(chunks, index=0):
    out = {"content": "", "reasoning": "", "calls": {}, "finish": []}
    for chunk in chunks:
        [choice] = chunk["choices"]
        if choice["index"] != index:
            continue
        delta = choice["delta"]
        out["content"] += delta.get("content") or ""
        out["reasoning"] += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls", []):
            entry = out["calls"].setdefault(call["index"], {"name": None, "arguments": ""})
            if call.get("function", {}).get("name"):
                assert entry["name"] is None and call["id"] and call["type"] == "function"
                entry["name"] = call["function"]["name"]
            entry["arguments"] += call.get("function", {}).get("arguments", "")
        if choice["finish_reason"]:
            out["finish"].append(choice["finish_reason"])
    return out


def whole_and_streamed(client, body, n=1):
    whole = client.post(CHAT, json={**body, "n": n}).json()
    chunks, done = sse_json(client.post(CHAT, json={**body, "n": n, "stream": True}).text)
    assert done == 1
    return whole, chunks


def check_call_answer(whole, chunks, n, content, reasoning=None):
    for index in range(n):
        choice = whole["choices"][index]
        message = choice["message"]
        assert message["content"] == content and choice["finish_reason"] == "tool_calls"
        [call] = message["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        if reasoning is not None:
            assert message["reasoning_content"] == reasoning
        streamed = assemble(chunks, index)
        assert streamed["content"] == (content or "") and "<tool" not in streamed["content"]
        assert streamed["finish"] == ["tool_calls"]
        [streamed_call] = streamed["calls"].values()
        assert streamed_call["name"] == "get_weather"
        assert json.loads(streamed_call["arguments"]) == {"city": "Paris"}
        if reasoning is not None:
            assert streamed["reasoning"] == reasoning


TEXT = "Let me check. " + CALL


@pytest.mark.parametrize("cut", range(1, len(TEXT)))
def test_auto_tool_call_cut_at_every_character(client, fake_engine, cut):
    use_parsers(client, fake_engine, tool="hermes")
    fake_engine.script = script(TEXT[:cut], TEXT[cut:])
    whole, chunks = whole_and_streamed(client, {"messages": MESSAGES, "tools": TOOLS})
    check_call_answer(whole, chunks, 1, "Let me check. ")


@pytest.mark.parametrize("n", [1, 2])
def test_auto_tool_call_one_token_at_a_time(client, fake_engine, n):
    use_parsers(client, fake_engine, tool="hermes")
    fake_engine.script = script(*token_pieces(TEXT))
    whole, chunks = whole_and_streamed(client, {"messages": MESSAGES, "tools": TOOLS}, n=n)
    check_call_answer(whole, chunks, n, "Let me check. ")


@pytest.mark.parametrize("cut", range(1, len("I think <tool is not a call")))
def test_text_that_only_looks_like_a_marker_is_content(client, fake_engine, cut):
    use_parsers(client, fake_engine, tool="hermes")
    text = "I think <tool is not a call"
    fake_engine.script = script(text[:cut], text[cut:])
    whole, chunks = whole_and_streamed(client, {"messages": MESSAGES, "tools": TOOLS})
    assert whole["choices"][0]["message"]["content"] == text and "tool_calls" not in whole["choices"][0]["message"]
    streamed = assemble(chunks)
    assert streamed["content"] == text and not streamed["calls"] and streamed["finish"] == ["stop"]


REASONED = THOUGHT + "Sure. " + CALL


@pytest.mark.parametrize("cut", range(1, len(token_pieces(REASONED))))
@pytest.mark.parametrize("n", [1, 2])
def test_reasoning_then_tool_call_cut_at_every_token(client, fake_engine, cut, n):
    use_parsers(client, fake_engine, reasoning="deepseek_r1", tool="hermes")
    pieces = token_pieces(REASONED)
    fake_engine.script = script("".join(pieces[:cut]), "".join(pieces[cut:]))
    whole, chunks = whole_and_streamed(client, {"messages": MESSAGES, "tools": TOOLS}, n=n)
    check_call_answer(whole, chunks, n, "Sure. ", reasoning="The user wants weather.")
    usage = whole["usage"]["completion_tokens_details"]
    assert usage["reasoning_tokens"] == n * len(tokenizer().encode("The user wants weather.",
                                                                    add_special_tokens=False))


def test_reasoning_without_tools(client, fake_engine):
    use_parsers(client, fake_engine, reasoning="deepseek_r1")
    fake_engine.script = script(*token_pieces(THOUGHT + "Hello there."))
    whole, chunks = whole_and_streamed(client, {"messages": MESSAGES})
    message = whole["choices"][0]["message"]
    assert message["reasoning_content"] == "The user wants weather." and message["content"] == "Hello there."
    streamed = assemble(chunks)
    assert streamed["reasoning"] == "The user wants weather." and streamed["content"] == "Hello there."
    assert all("reasoning_content" in chunk["choices"][0]["delta"] for chunk in chunks)
    usage_chunk = sse_json(client.post(CHAT, json={"messages": MESSAGES, "stream": True,
                                                   "stream_options": {"include_usage": True}}).text)[0][-1]
    assert usage_chunk["usage"]["completion_tokens_details"] == whole["usage"]["completion_tokens_details"]


def test_without_a_reasoning_parser_everything_is_content(client, fake_engine):
    fake_engine.script = script("<think>x</think>y")
    message = client.post(CHAT, json={"messages": MESSAGES}).json()["choices"][0]["message"]
    assert message["content"] == "<think>x</think>y" and "reasoning_content" not in message


def test_tool_choice_none_does_not_parse_tool_calls(client, fake_engine):
    use_parsers(client, fake_engine, tool="hermes")
    fake_engine.script = script(TEXT)
    message = client.post(CHAT, json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"}).json()[
        "choices"][0]["message"]
    assert message["content"] == TEXT and "tool_calls" not in message


def test_parallel_tool_calls_false_keeps_the_first_call(client, fake_engine):
    use_parsers(client, fake_engine, tool="hermes")
    second = CALL.replace("Paris", "Rome")
    fake_engine.script = script(*token_pieces(CALL + second))
    body = {"messages": MESSAGES, "tools": TOOLS, "parallel_tool_calls": False}
    whole, chunks = whole_and_streamed(client, body)
    [call] = whole["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert list(assemble(chunks)["calls"]) == [0]
    both = client.post(CHAT, json={**body, "parallel_tool_calls": True}).json()["choices"][0]["message"]
    assert len(both["tool_calls"]) == 2


ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}}, "required": ["answer"],
          "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}


def _accepts(grammar_tag: str, text: str) -> bool:
    """Whether xgrammar (vLLM's backend) takes `text`, whole, under the structural tag."""
    import xgrammar

    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer()))
    matcher = xgrammar.GrammarMatcher(compiler.compile_structural_tag(grammar_tag))
    return matcher.accept_string(text) and matcher.is_terminated() or matcher.accept_token(
        tokenizer().eos_token_id) and matcher.is_terminated()


@pytest.mark.parametrize("parallel", [None, False])
def test_auto_with_a_response_format_calls_a_tool_or_answers_in_the_format(client, fake_engine, parallel):
    """pydantic-ai's NativeOutput: the engine gets "a hermes call, or JSON in the schema" (xgrammar's
    structural tag, built by vLLM's own hermes builder), and the output is read either way."""
    use_parsers(client, fake_engine, tool="hermes")
    body = {"messages": MESSAGES, "tools": TOOLS, "response_format": FORMAT,
            **({"parallel_tool_calls": parallel} if parallel is not None else {})}
    fake_engine.script = script(*token_pieces(CALL))
    whole, chunks = whole_and_streamed(client, body)
    check_call_answer(whole, chunks, 1, None)
    constraint = fake_engine.calls[0].params.structured_outputs
    assert constraint.structural_tag and constraint.json is None
    tag = constraint.structural_tag
    assert _accepts(tag, CALL) and _accepts(tag, '{"answer": "yes"}')
    assert not _accepts(tag, "free text") and not _accepts(tag, '{"answer": "too long an answer"}')
    assert _accepts(tag, CALL + CALL) is (parallel is None)
    fake_engine.script = script(*token_pieces('{"answer": "yes"}'))
    whole, chunks = whole_and_streamed(client, body)
    message = whole["choices"][0]["message"]
    assert json.loads(message["content"]) == {"answer": "yes"} and "tool_calls" not in message
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert json.loads(assemble(chunks)["content"]) == {"answer": "yes"}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_beside_a_response_format_is_the_answer(client, fake_engine, choice):
    """instructor's RESPONSES_TOOLS: the forced call is the whole answer; the format has no text to shape."""
    fake_engine.max_model_len = 4096
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": choice, "response_format": FORMAT}
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    schema = fake_engine.calls[0].params.structured_outputs.json
    assert schema == TOOLS[0]["function"]["parameters"] if isinstance(choice, dict) else schema["type"] == "array"


def test_without_a_structural_tag_the_format_alone_applies(client, fake_engine):
    """A parser vLLM has no structural-tag builder for: the format constrains the output, as in vLLM."""
    use_parsers(client, fake_engine, tool="pythonic")
    response = client.post(CHAT, json={"messages": MESSAGES, "tools": TOOLS, "response_format": FORMAT})
    assert response.status_code == 200
    assert fake_engine.calls[0].params.structured_outputs.json == ANSWER
