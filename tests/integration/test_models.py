"""Several models behind one server, on real engines through the OpenAI SDK: the bundled model under
two names, its tiny LoRA adapter (static, and another loaded at run time) and the tiny embedding
model on a second engine (vLLM's pooling runner)."""

import asyncio
import math

import httpx
import openai
import pytest

from choir.core.settings import BUNDLED_LORA_DIR, bundled_model_dir
from tests.integration.server import start_server

pytestmark = pytest.mark.engine
PROMPT = "Once upon a time"
GREEDY = {"ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def models_server(tmp_path_factory):
    # One adapter slot (--max-loras 1): a base-model row in a LoRA batch then points at that slot, which
    # is where vLLM-CPU's mixed-batch bug shows (choir/engine/vllm/cpu_lora_fix.py).
    server = start_server(tmp_path_factory.mktemp("models") / "server.log", env={
        "CHOIR_SERVED_MODEL_NAME": "choir-tiny,tiny-alias", "CHOIR_LORA_MODULES": f"tiny-lora={BUNDLED_LORA_DIR}",
        "CHOIR_ENGINE_ARGS": "--max-lora-rank 8 --max-loras 1", "CHOIR_ALLOW_RUNTIME_LORA": "true",
        "CHOIR_EMBEDDING_MODEL": str(bundled_model_dir("embed"))})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mclient(models_server):
    return openai.OpenAI(base_url=f"{models_server.base_url}/v1", api_key="x", max_retries=0, timeout=120)


def greedy(client, model, **kwargs):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                           extra_body=GREEDY, **kwargs)
    return completion.choices[0].token_ids, completion.model


def test_every_name_is_listed(mclient):
    cards = {card.id: card for card in mclient.models.list().data}
    assert list(cards) == ["choir-tiny", "tiny-alias", "tiny-lora", "choir-tiny-embed"]
    assert cards["tiny-lora"].parent == "choir-tiny" and cards["tiny-lora"].root == str(BUNDLED_LORA_DIR)


def test_the_adapter_changes_a_seeded_greedy_answer(mclient):
    base, base_model = greedy(mclient, "choir-tiny")
    tuned, tuned_model = greedy(mclient, "tiny-lora")
    assert tuned != base and (base_model, tuned_model) == ("choir-tiny", "tiny-lora")
    alias, alias_model = greedy(mclient, "tiny-alias")
    assert alias == base and alias_model == "tiny-alias"  # an alias is the same model
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0, "extra_body": GREEDY}
    assert mclient.chat.completions.create(model="tiny-lora", **chat).choices[0].token_ids != \
        mclient.chat.completions.create(model="choir-tiny", **chat).choices[0].token_ids


def test_base_requests_beside_adapter_requests_are_unchanged(models_server, mclient):
    base, _ = greedy(mclient, "choir-tiny")
    tuned, _ = greedy(mclient, "tiny-lora")

    async def together():
        client = openai.AsyncOpenAI(base_url=f"{models_server.base_url}/v1", api_key="x", max_retries=0)
        calls = [client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=GREEDY)
                 for model in ("choir-tiny", "tiny-lora") * 3]
        return [c.choices[0].token_ids for c in await asyncio.gather(*calls)]

    assert asyncio.run(together()) == [base, tuned] * 3


def test_fan_out_children_carry_the_adapter(mclient):
    kwargs = dict(model="tiny-lora", prompt=PROMPT, max_tokens=8, temperature=1.0, extra_body=GREEDY)
    fanned = mclient.completions.create(n=3, seed=5, **kwargs).choices
    singles = [mclient.completions.create(n=1, seed=5 + i, **kwargs).choices[0].token_ids for i in range(3)]
    assert [choice.token_ids for choice in fanned] == singles


def test_adapters_load_and_unload_at_run_time(models_server, mclient):
    base = models_server.base_url
    tuned, _ = greedy(mclient, "tiny-lora")
    async def load_two_at_once():  # each gets an adapter id of its own
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/load_lora_adapter", json={
                "lora_name": name, "lora_path": str(BUNDLED_LORA_DIR)}) for name in ("again", "twice")))

    assert [response.status_code for response in asyncio.run(load_two_at_once())] == [200, 200]
    assert greedy(mclient, "again")[0] == greedy(mclient, "twice")[0] == tuned  # the same weights
    again = {"lora_name": "again", "lora_path": str(BUNDLED_LORA_DIR)}
    taken = httpx.post(f"{base}/v1/load_lora_adapter", json=again)
    assert taken.status_code == 400 and "load_inplace" in taken.json()["error"]["message"]
    replaced = httpx.post(f"{base}/v1/load_lora_adapter", json={**again, "load_inplace": True})
    assert replaced.status_code == 200 and greedy(mclient, "again")[0] == tuned
    assert httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "twice"}).status_code == 200
    bad = httpx.post(f"{base}/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": "/nonexistent"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path"
    assert httpx.get(f"{base}/health").status_code == 200  # a bad adapter harms nothing
    assert httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "again"}).status_code == 200
    with pytest.raises(openai.BadRequestError):
        greedy(mclient, "again")


def test_embeddings_through_the_sdk(mclient):
    texts = ["hello world", "a different text", "hello world"]
    floats = mclient.embeddings.create(model="choir-tiny-embed", input=texts, encoding_format="float")
    encoded = mclient.embeddings.create(model="choir-tiny-embed", input=texts)  # the SDK asks for base64
    assert [d.index for d in floats.data] == [0, 1, 2]
    for a, b in zip(floats.data, encoded.data, strict=True):
        assert len(a.embedding) == 128 and a.embedding == pytest.approx(b.embedding, abs=1e-6)
        assert math.isclose(sum(x * x for x in a.embedding), 1.0, rel_tol=1e-3)  # normalized
    assert floats.data[0].embedding == pytest.approx(floats.data[2].embedding, abs=1e-5)
    assert floats.data[0].embedding != pytest.approx(floats.data[1].embedding, abs=1e-3)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    short = mclient.embeddings.create(model="choir-tiny-embed", input="hello world", dimensions=64)
    assert len(short.data[0].embedding) == 64


def test_token_id_input_equals_its_text(models_server, mclient):
    ids = httpx.post(f"{models_server.base_url}/tokenize", json={"prompt": "hello world"}).json()["tokens"]
    by_text = mclient.embeddings.create(model="choir-tiny-embed", input="hello world").data[0].embedding
    by_ids = mclient.embeddings.create(model="choir-tiny-embed", input=ids).data[0].embedding
    assert by_ids == pytest.approx(by_text, abs=1e-5)


def test_base64_in_half_precision_decodes_to_the_floats(models_server, mclient):
    import base64

    import numpy as np

    floats = mclient.embeddings.create(model="choir-tiny-embed", input="hello", encoding_format="float")
    half = httpx.post(f"{models_server.base_url}/v1/embeddings", json={
        "input": "hello", "encoding_format": "base64", "embed_dtype": "float16", "endianness": "big"}).json()
    values = np.frombuffer(base64.b64decode(half["data"][0]["embedding"]), dtype=">f2")
    assert values.tolist() == pytest.approx(floats.data[0].embedding, abs=1e-3)


@pytest.mark.parametrize("kwargs, param", [
    ({"model": "choir-tiny-embed", "input": "x", "dimensions": 50}, "dimensions"),
    ({"model": "choir-tiny", "input": "x"}, "model"),
    ({"model": "choir-tiny-embed", "input": []}, "input")])
def test_embedding_errors_name_the_field(mclient, kwargs, param):
    with pytest.raises(openai.BadRequestError) as raised:
        mclient.embeddings.create(**kwargs)
    assert raised.value.body["param"] == param


def test_one_health_and_metrics_for_both_engines(models_server, mclient):
    mclient.embeddings.create(model="choir-tiny-embed", input="x")
    assert httpx.get(f"{models_server.base_url}/health").json()["status"] == "ok"
    assert "vllm:num_requests_running" in httpx.get(f"{models_server.base_url}/metrics").text


def test_tokenize_and_detokenize_serve_the_embedding_model(models_server):
    """vLLM's server tokenizes for pooling models too: the embedding model's own tokenizer and length."""
    base = models_server.base_url
    embed = httpx.post(f"{base}/tokenize", json={"model": "choir-tiny-embed", "prompt": "hello world"}).json()
    generation = httpx.post(f"{base}/tokenize", json={"model": "choir-tiny", "prompt": "hello world"}).json()
    assert embed["max_model_len"] == 512 and generation["max_model_len"] == 2048
    assert embed["count"] == len(embed["tokens"]) > 0
    chat = httpx.post(f"{base}/tokenize", json={"model": "choir-tiny-embed",
                                                "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code in (200, 400), chat.text  # 400 (naming `messages`) if it has no chat template
    if chat.status_code == 400:
        assert chat.json()["error"]["param"] == "messages"
    text = httpx.post(f"{base}/detokenize", json={"model": "choir-tiny-embed", "tokens": embed["tokens"]}).json()
    assert "hello world" in text["prompt"]
