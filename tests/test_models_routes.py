"""Several models behind one endpoint, over fake engines: aliases, LoRA adapters (static and at run
time) and an embedding engine; what reaches which engine, and a 4xx for every model mix-up."""

import base64
import struct

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import LoraModule, RoleModel, Settings
from tests.fakes import FakeEngine, FakePoolingEngine, fake_engine_factory

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def make_client(runtime_lora=False, embedding=True, **engine):
    generation = FakeEngine(served_model_names=("base", "alias"), adapters={"tuned": "/adapters/tuned"}, **engine)
    embedder = FakePoolingEngine()
    settings = Settings(served_model_name="base,alias", allow_runtime_lora=runtime_lora,
                        lora_modules=(LoraModule("tuned", "/adapters/tuned"),),
                        pooling=(RoleModel("embed", "/models/fake-embed"),) if embedding else ())
    app = create_app(settings, engine_factory=fake_engine_factory(generation),
                     factories={"embed": fake_engine_factory(embedder)})
    return TestClient(app), generation, embedder


@pytest.fixture
def models():
    client, generation, embedder = make_client(runtime_lora=True)
    with client:
        yield client, generation, embedder


def test_the_model_list_has_every_name(models):
    client, _, _ = models
    cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    assert list(cards) == ["base", "alias", "tuned", "fake-embed"]
    assert cards["tuned"]["parent"] == "base" and cards["tuned"]["root"] == "/adapters/tuned"
    assert cards["base"]["parent"] is None and cards["fake-embed"]["max_model_len"] == 64
    assert client.get("/v1/models/tuned").json()["parent"] == "base"
    assert client.get("/v1/models/fake-embed").json()["id"] == "fake-embed"


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "x"}), (CHAT, {"messages": MESSAGES}),
                                        ("/v1/responses", {"input": "x"})])
def test_an_adapter_is_chosen_by_model_for_every_child(models, path, body):
    client, generation, _ = models
    n = {} if path == "/v1/responses" else {"n": 3, "seed": 1}
    answer = client.post(path, json={**body, **n, "model": "tuned"}).json()
    assert answer["model"] == "tuned"
    assert [call.options.adapter for call in generation.calls] == ["tuned"] * (3 if n else 1)
    assert client.post(path, json={**body, "model": "alias"}).json()["model"] == "alias"  # the name sent
    assert generation.calls[-1].options.adapter is None
    assert client.post(path, json=body).json()["model"] == "base"  # none sent: the first name


def test_runtime_adapters_load_serve_and_unload(models):
    client, generation, _ = models
    loaded = client.post("/v1/load_lora_adapter", json={"lora_name": "fresh", "lora_path": "/adapters/fresh"})
    assert loaded.status_code == 200 and "fresh" in loaded.text
    assert "fresh" in [card["id"] for card in client.get("/v1/models").json()["data"]]
    assert client.post(CHAT, json={"messages": MESSAGES, "model": "fresh"}).status_code == 200
    assert generation.calls[-1].options.adapter == "fresh"
    again = client.post("/v1/load_lora_adapter", json={"lora_name": "fresh", "lora_path": "/adapters/v2"})
    assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    replaced = client.post("/v1/load_lora_adapter", json={"lora_name": "fresh", "lora_path": "/adapters/v2",
                                                         "load_inplace": True})
    assert replaced.status_code == 200 and generation.adapters["fresh"] == "/adapters/v2"
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "fresh"}).status_code == 200
    gone = client.post(CHAT, json={"messages": MESSAGES, "model": "fresh"})
    assert gone.status_code == 400 and gone.json()["error"]["param"] == "model"


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/nowhere"}, 400, "lora_path"),
    ("/v1/load_lora_adapter", {"lora_name": "base", "lora_path": "/adapters/x"}, 400, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": "fake-embed", "lora_path": "/adapters/x"}, 400, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": "", "lora_path": "/adapters/x"}, 400, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": "x"}, 400, "lora_path"),
    ("/v1/unload_lora_adapter", {"lora_name": "never-loaded"}, 404, "lora_name"),
])
def test_adapter_errors(models, path, body, status, param):
    client, _, _ = models
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_runtime_adapters_are_off_unless_allowed():
    client, generation, _ = make_client(runtime_lora=False)
    with client:
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            response = client.post(path, json={"lora_name": "tuned", "lora_path": "/adapters/x"})
            assert response.status_code == 404 and "CHOIR_ALLOW_RUNTIME_LORA" in response.json()["error"]["message"]
        assert generation.adapters == {"tuned": "/adapters/tuned"}  # the static one stays


def test_embeddings(models):
    client, _, embedder = models
    body = client.post("/v1/embeddings", json={"input": ["ab", "ba", "x"]}, headers={"X-Request-Id": "e"}).json()
    assert body["object"] == "list" and body["model"] == "fake-embed"
    assert [item["index"] for item in body["data"]] == [0, 1, 2] and len(body["data"][0]["embedding"]) == 8
    assert body["usage"] == {"prompt_tokens": 3 + 3 + 2, "total_tokens": 8}
    assert [request_id for _, request_id, _, _ in embedder.embedded] == ["embd-e-0", "embd-e-1", "embd-e-2"]
    encoded = client.post("/v1/embeddings", json={"input": "ab", "encoding_format": "base64"}).json()
    raw = base64.b64decode(encoded["data"][0]["embedding"])
    assert list(struct.unpack("<8f", raw)) == pytest.approx(body["data"][0]["embedding"], abs=1e-6)
    ids = client.post("/v1/embeddings", json={"input": [0, 100, 101]}).json()["data"][0]["embedding"]
    assert ids == pytest.approx(body["data"][0]["embedding"])  # "ab" is bos, 100, 101 here
    short = client.post("/v1/embeddings", json={"input": "ab", "dimensions": 4, "use_activation": False}).json()
    assert len(short["data"][0]["embedding"]) == 4 and embedder.embedded[-1][2:] == (4, False)


@pytest.mark.parametrize("body, status, param", [
    ({"input": []}, 400, "input"),
    ({"input": [[]]}, 400, "input"),
    ({"input": "", "add_special_tokens": False}, 400, "input"),
    ({"input": "x" * 80}, 400, "input"),
    ({"input": ["ok", "x" * 80]}, 400, "input[1]"),
    ({"input": "x", "dimensions": 5}, 400, "dimensions"),
    ({"input": "x", "dimensions": 16}, 400, "dimensions"),
    ({"input": "x", "encoding_format": "bytes"}, 400, "encoding_format"),
    ({"input": "x", "model": "base"}, 400, "model"),
    ({"input": "x", "model": "tuned"}, 400, "model"),
    ({"input": "x", "model": "nope"}, 400, "model"),
    ({"input": "x", "truncation_side": "left"}, 400, "truncation_side"),
    ({"input": "x", "embed_dtype": "fp8_e4m3", "encoding_format": "base64"}, 400, "embed_dtype"),
    ({"input": "x", "embed_dtype": "float64"}, 400, "embed_dtype"),
    ({"input": "x", "endianness": "middle"}, 400, "endianness"),
    ({"input": "x", "priority": 1}, 400, "priority"),
    ({"input": "x", "padding": "max_length"}, 400, "padding"),
])
def test_embedding_errors(models, body, status, param):
    client, _, _ = models
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_a_long_input_may_be_truncated(models):
    client, _, embedder = models
    assert client.post("/v1/embeddings", json={"input": "x" * 80, "truncate_prompt_tokens": 10}).status_code == 200
    assert len(embedder.embedded[-1][0].token_ids) == 10


def test_generation_endpoints_point_an_embedding_model_to_embeddings(models):
    client, _, _ = models
    error = client.post(CHAT, json={"messages": MESSAGES, "model": "fake-embed"}).json()["error"]
    assert error["param"] == "model" and "/v1/embeddings" in error["message"]


def test_without_an_embedding_model_embeddings_are_a_404():
    client, _, _ = make_client(embedding=False)
    with client:
        response = client.post("/v1/embeddings", json={"input": "x"})
        assert response.status_code == 404 and "CHOIR_EMBEDDING_MODEL" in response.json()["error"]["message"]
        assert [card["id"] for card in client.get("/v1/models").json()["data"]] == ["base", "alias", "tuned"]


def test_health_covers_both_engines(models):
    client, _, embedder = models
    assert client.get("/health").status_code == 200
    embedder.is_alive = False
    response = client.get("/health")
    assert response.status_code == 503 and "embedding" in response.json()["error"]["message"]


@pytest.mark.parametrize("embed_dtype, endianness", [("float32", "little"), ("float16", "big"),
                                                     ("bfloat16", "native"), ("bfloat16", "big")])
def test_base64_embeddings_in_vllms_dtypes_and_byte_orders(models, embed_dtype, endianness):
    """As vLLM encodes them: the values converted as torch converts them, then in the byte order asked for."""
    import sys

    import numpy as np
    import torch

    client, _, _ = models
    body = {"input": "abcab"}  # normalized: values that float16 and bfloat16 must round
    floats = client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    encoded = client.post("/v1/embeddings", json={**body, "encoding_format": "base64", "embed_dtype": embed_dtype,
                                                  "endianness": endianness}).json()["data"][0]["embedding"]
    dtype = getattr(torch, embed_dtype)
    expected = torch.tensor(floats, dtype=torch.float32).to(dtype).view(torch.int16 if dtype.itemsize == 2 else dtype)
    array = expected.numpy()
    if endianness != "native" and endianness != sys.byteorder:
        array = array.byteswap()
    assert base64.b64decode(encoded) == array.tobytes()
    assert np.frombuffer(base64.b64decode(encoded), dtype=np.uint8).size == len(floats) * dtype.itemsize
