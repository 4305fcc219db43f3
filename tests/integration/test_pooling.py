"""Rerank, score and classify on real engines (vLLM's pooling runner) beside the generation engine: the
bundled tiny cross-encoder and classifier, through httpx and Cohere's own SDK (v1 and v2 clients)."""

import math

import cohere
import httpx
import pytest

from choir.core.settings import bundled_model_dir
from tests.integration.server import start_server

pytestmark = pytest.mark.engine
QUERY = "what is a cat"
DOCS = ["a cat is an animal", "the weather is nice today", "cats purr and sleep", "tax forms are due"]
KEY = "pool-key"


@pytest.fixture(scope="module")
def pooling_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("pooling") / "server.log", env={
        "CHOIR_RERANK_MODEL": str(bundled_model_dir("rerank")),
        "CHOIR_CLASSIFY_MODEL": str(bundled_model_dir("classify")), "CHOIR_API_KEY": KEY})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(pooling_server):
    with httpx.Client(base_url=pooling_server.base_url, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


def test_every_role_is_served_and_listed(http):
    assert [card["id"] for card in http.get("/v1/models").json()["data"]] == [
        "choir-tiny", "choir-tiny-rerank", "choir-tiny-classify"]
    assert http.get("/health").json()["status"] == "ok"
    assert http.post("/tokenize", json={"model": "choir-tiny-rerank", "prompt": "a cat"}).json()["max_model_len"] == 512


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_sorts_by_the_cross_encoders_scores(http, path):
    body = http.post(path, json={"model": "choir-tiny-rerank", "query": QUERY, "documents": DOCS}).json()
    results = body["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3] and body["model"] == "choir-tiny-rerank"
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)  # a sigmoid: one label
    assert all(r["document"]["text"] == DOCS[r["index"]] for r in results)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 4 * 4
    # /score of the same pairs gives the same numbers, in the documents' order
    scored = http.post("/score", json={"text_1": QUERY, "text_2": DOCS}).json()["data"]
    assert [d["score"] for d in scored] == pytest.approx([next(r["relevance_score"] for r in results
                                                               if r["index"] == i) for i in range(4)], rel=1e-4)


def test_score_pair_by_pair_and_the_logit(http):
    pairs = http.post("/v1/score", json={"text_1": [QUERY, "dogs"], "text_2": DOCS[:2]}).json()
    one = http.post("/score", json={"text_1": "dogs", "text_2": DOCS[1]}).json()
    assert pairs["data"][1]["score"] == pytest.approx(one["data"][0]["score"], rel=1e-4)
    logit = http.post("/score", json={"text_1": "dogs", "text_2": DOCS[1], "use_activation": False}).json()
    assert 1 / (1 + math.exp(-logit["data"][0]["score"])) == pytest.approx(one["data"][0]["score"], rel=1e-3)


def test_cohere_sdk_v2_and_v1_rerank(pooling_server, http):
    direct = http.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]
    v2 = cohere.ClientV2(api_key=KEY, base_url=pooling_server.base_url, timeout=120)
    answer = v2.rerank(model="choir-tiny-rerank", query=QUERY, documents=DOCS, top_n=2)
    assert [(r.index, round(r.relevance_score, 4)) for r in answer.results] == \
        [(r["index"], round(r["relevance_score"], 4)) for r in direct[:2]]
    v1 = cohere.Client(api_key=KEY, base_url=pooling_server.base_url, timeout=120)
    old = v1.rerank(model="choir-tiny-rerank", query=QUERY, documents=DOCS, return_documents=True)
    assert [r.index for r in old.results] == [r["index"] for r in direct]
    assert old.results[0].document.text == DOCS[direct[0]["index"]]
    with pytest.raises(cohere.core.ApiError) as raised:
        v2.rerank(model="choir-tiny", query=QUERY, documents=DOCS)  # the generation model
    assert raised.value.status_code == 400 and raised.value.body["error"]["param"] == "model"


def test_max_tokens_per_doc_cuts_a_long_document_to_fit(http):
    long = "cats purr " * 400  # past the 512-token context as it is
    assert http.post("/rerank", json={"query": QUERY, "documents": [long]}).status_code == 400
    body = http.post("/rerank", json={"query": QUERY, "documents": [long, DOCS[0]], "max_tokens_per_doc": 50}).json()
    query = len(http.post("/tokenize", json={"model": "choir-tiny-rerank", "prompt": QUERY,
                                             "add_special_tokens": False}).json()["tokens"])
    assert body["usage"]["prompt_tokens"] <= 2 * (query + 50 + 2)  # each document at most 50 tokens
    assert {r["index"] for r in body["results"]} == {0, 1}
    assert next(r for r in body["results"] if r["index"] == 0)["document"]["text"] == long  # as sent


def test_classify_over_the_models_labels(http):
    body = http.post("/classify", json={"input": ["I love it", "I hate it", "meh"]}).json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and body["model"] == "choir-tiny-classify"
    for item in body["data"]:
        assert item["num_classes"] == 3 and sum(item["probs"]) == pytest.approx(1.0, abs=1e-4)
        assert item["label"] == ("negative", "neutral", "positive")[item["probs"].index(max(item["probs"]))]
    assert body["usage"]["prompt_tokens"] > 3


@pytest.mark.parametrize("path, body, param", [
    ("/rerank", {"query": QUERY, "documents": []}, "documents"),
    ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
    ("/rerank", {"query": QUERY, "documents": ["x " * 600]}, "documents[0]"),  # past the 512-token context
    ("/rerank", {"query": QUERY, "documents": DOCS, "model": "choir-tiny"}, "model"),
    ("/rerank", {"query": QUERY, "documents": DOCS, "model": "choir-tiny-classify"}, "model"),
    ("/score", {"text_1": [QUERY, QUERY], "text_2": DOCS}, "text_2"),
    ("/classify", {"input": "x " * 600}, "input"),
    ("/classify", {"input": "x", "model": "choir-tiny-rerank"}, "model"),
])
def test_bad_input_is_a_400_naming_the_field(http, path, body, param):
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_the_generation_engine_still_serves_and_points_pooling_names_elsewhere(http):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert http.post("/v1/chat/completions", json=chat).status_code == 200
    error = http.post("/v1/chat/completions", json={**chat, "model": "choir-tiny-rerank"}).json()["error"]
    assert error["param"] == "model" and "/rerank" in error["message"]
    assert httpx.post(f"{http.base_url}/rerank", json={"query": "q", "documents": ["d"]}).status_code == 401
