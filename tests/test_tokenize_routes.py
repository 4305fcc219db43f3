"""POST /tokenize and /detokenize over the fake engine (token id = code point + 3, bos 0): vLLM's shapes,
the same prompt the generation endpoints send, and a 400 for what cannot be tokenized."""

import pytest

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]


def test_text_gets_its_tokens_with_bos_and_their_pieces(client):
    body = client.post("/tokenize", json={"prompt": "hi", "return_token_strs": True}).json()
    assert body == {"count": 3, "max_model_len": 64, "tokens": [0, 107, 108], "token_strs": ["<s>", "h", "i"]}
    plain = client.post("/tokenize", json={"prompt": "hi", "add_special_tokens": False}).json()
    assert plain["tokens"] == [107, 108] and plain["token_strs"] is None


def test_messages_get_the_tokens_a_chat_request_sends(client, fake_engine):
    tokens = client.post("/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    client.post(CHAT, json={"messages": MESSAGES})
    assert tokens == fake_engine.calls[0].prompt.token_ids
    assert client.post("/tokenize", json={"messages": MESSAGES}).json()["count"] == \
        client.post(CHAT, json={"messages": MESSAGES}).json()["usage"]["prompt_tokens"]
    without = client.post("/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}).json()["tokens"]
    assert tokens[: len(without)] == without and len(without) < len(tokens)


def test_tools_and_template_kwargs_reach_the_template(client, fake_engine):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    client.post("/tokenize", json={"messages": MESSAGES, "tools": tools, "chat_template_kwargs": {"x": 1}})
    kwargs = fake_engine.templates[-1].kwargs
    assert kwargs["x"] == 1 and kwargs["tools"][0]["function"]["name"] == "f"


def test_detokenize_is_the_inverse(client):
    tokens = client.post("/tokenize", json={"prompt": "Hello there"}).json()["tokens"]
    # the bos the tokenizer added comes back too, as vLLM's tokenizer decodes it
    assert client.post("/detokenize", json={"tokens": tokens}).json() == {"prompt": "<s>Hello there"}
    assert client.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, "messages"),
    ("/tokenize", {"prompt": ["x"]}, "prompt"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, "continue_final_message"),
    ("/tokenize", {"prompt": "x", "model": "gpt-4"}, "model"),
    ("/detokenize", {"tokens": [5, 0x110000 + 3]}, "tokens[1]"),
    ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
    ("/detokenize", {}, "tokens"),  # the missing field
    ("/detokenize", {"tokens": [1], "model": "gpt-4"}, "model"),
])
def test_what_cannot_be_tokenized_is_a_400_naming_the_field(client, path, body, param):
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_the_tokenizer_routes_take_json_only(client):
    assert client.post("/tokenize", content=b"prompt=x", headers={"content-type": "text/plain"}).status_code == 415


def test_an_embedding_models_name_tokenizes_with_the_embedding_engine():
    """As vLLM's server: /tokenize and /detokenize serve pooling models too (the `model` picks the engine)."""
    from litestar.testing import TestClient

    from choir.app.asgi import create_app
    from choir.core.settings import RoleModel, Settings
    from tests.fakes import FakeEngine, FakePoolingEngine, fake_engine_factory

    embedding = FakePoolingEngine(max_model_len=32)
    app = create_app(Settings(served_model_name="fake-model", pooling=(RoleModel("embed", "/models/fake-embed"),)),
                     engine_factory=fake_engine_factory(FakeEngine()),
                     factories={"embed": fake_engine_factory(embedding)})
    with TestClient(app) as client:
        text = client.post("/tokenize", json={"model": "fake-embed", "prompt": "hi"}).json()
        chat = client.post("/tokenize", json={"model": "fake-embed", "messages": MESSAGES}).json()
        generation = client.post("/tokenize", json={"model": "fake-model", "prompt": "hi"}).json()
        back = client.post("/detokenize", json={"model": "fake-embed", "tokens": text["tokens"][1:]}).json()
        too_big = client.post("/detokenize", json={"model": "fake-embed", "tokens": [embedding.vocab_size]})
        unknown = client.post("/tokenize", json={"model": "nope", "prompt": "hi"})
    assert text["max_model_len"] == 32 and text["tokens"] == [0, 107, 108]
    assert chat["max_model_len"] == 32 and chat["count"] > 3
    assert generation["max_model_len"] == 64
    assert back == {"prompt": "hi"}
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "tokens[0]"
    assert unknown.status_code in (400, 404)
