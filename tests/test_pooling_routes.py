"""/rerank (/v1/rerank, /v2/rerank), /score and /classify over fake pooling engines: shapes, order, usage,
what reaches the engine, and a 400 naming the field for every bad input."""

import math

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import RoleModel, Settings
from tests.fakes import FakeEngine, FakePoolingEngine, encode, fake_engine_factory

RERANKS = ["/rerank", "/v1/rerank", "/v2/rerank"]
DOCS = ["bbbb", "abab", "aaaa", "cc"]


def make_client(roles=("embed", "rerank", "classify"), **settings):
    engines = {"embed": FakePoolingEngine(),
               "rerank": FakePoolingEngine(served_model_names=("fake-rerank",), role="rerank", labels=("relevance",)),
               "classify": FakePoolingEngine(served_model_names=("fake-classify",), role="classify",
                                             labels=("negative", "neutral", "positive"))}
    pooling = tuple(RoleModel(role, f"/models/{role}") for role in roles)
    app = create_app(Settings(served_model_name="fake-model", pooling=pooling, **settings),
                     engine_factory=fake_engine_factory(FakeEngine()),
                     factories={role: fake_engine_factory(engines[role]) for role in roles})
    return TestClient(app), engines


@pytest.fixture(scope="module")
def served():
    client, engines = make_client()
    with client:
        yield client, engines


def expected_logit(query: str, document: str) -> float:
    """The fake cross-encoder's logit: from the pair's share of even token ids (tests/fakes.py)."""
    ids = [*encode(query), 0, *encode(document)]
    return 4 * sum(1 for token in ids if token % 2 == 0) / len(ids) - 2


def expected_score(query: str, document: str) -> float:
    return 1 / (1 + math.exp(-expected_logit(query, document)))


@pytest.mark.parametrize("path", RERANKS)
def test_rerank_sorts_the_documents_by_relevance(served, path):
    client, engines = served
    response = client.post(path, json={"query": "q", "documents": DOCS}, headers={"X-Request-Id": "r"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == "rerank-r" and body["model"] == "fake-rerank"
    scores = {i: expected_score("q", doc) for i, doc in enumerate(DOCS)}
    assert [r["index"] for r in body["results"]] == sorted(scores, key=scores.get, reverse=True)
    assert all(r["relevance_score"] == pytest.approx(scores[r["index"]]) for r in body["results"])
    assert all(r["document"] == {"text": DOCS[r["index"]]} for r in body["results"])
    tokens = sum(len(encode("q")) + 1 + len(encode(doc)) for doc in DOCS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert {request_id for _, request_id in engines["rerank"].classified[-4:]} == {f"rerank-r-{i}" for i in range(4)}


def test_rerank_top_n_document_objects_and_no_documents(served):
    client, _ = served
    one = client.post("/rerank", json={"query": "q", "documents": "abab"}).json()  # one document as a string
    assert one["results"] == [{"index": 0, "relevance_score": pytest.approx(expected_score("q", "abab")),
                               "document": {"text": "abab"}}]
    body = client.post("/rerank", json={"query": "q", "documents": [{"text": d} for d in DOCS], "top_n": 2,
                                        "return_documents": False}).json()
    assert len(body["results"]) == 2 and all("document" not in r for r in body["results"])
    full = client.post("/rerank", json={"query": "q", "documents": DOCS}).json()["results"]
    assert [r["index"] for r in body["results"]] == [r["index"] for r in full[:2]]
    assert len(client.post("/rerank", json={"query": "q", "documents": DOCS, "top_n": 10}).json()["results"]) == 4


def test_max_tokens_per_doc_cuts_each_document_before_pairing(served):
    client, engines = served
    body = client.post("/rerank", json={"query": "q", "documents": ["abcdef", "ab"], "max_tokens_per_doc": 3}).json()
    assert {r["index"]: r["document"]["text"] for r in body["results"]} == {0: "abcdef", 1: "ab"}  # as sent
    pairs = sorted(prompt.token_ids for prompt, _ in engines["rerank"].classified[-2:])
    assert pairs == sorted([[*encode("q"), 0, *encode("abc")], [*encode("q"), 0, *encode("ab")]])
    assert client.post("/rerank", json={"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}).json()[
        "error"]["param"] == "max_tokens_per_doc"


def test_use_activation_false_gives_the_logit(served):
    client, _ = served
    raw = client.post("/score", json={"text_1": "q", "text_2": "bbbb", "use_activation": False}).json()
    assert raw["data"][0]["score"] == pytest.approx(expected_logit("q", "bbbb"))
    ranked = client.post("/rerank", json={"query": "q", "documents": DOCS, "use_activation": False}).json()
    assert [r["relevance_score"] for r in ranked["results"]] == pytest.approx(
        sorted((expected_logit("q", doc) for doc in DOCS), reverse=True))


@pytest.mark.parametrize("text_1, text_2, pairs", [
    ("q", "ab", [("q", "ab")]),
    ("q", ["ab", "bb", "cd"], [("q", "ab"), ("q", "bb"), ("q", "cd")]),
    (["q", "r"], ["ab", "bb"], [("q", "ab"), ("r", "bb")]),
    (["q"], ["ab", "bb"], [("q", "ab"), ("q", "bb")]),
])
@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_one_to_one_one_to_many_and_pair_by_pair(served, path, text_1, text_2, pairs):
    client, _ = served
    body = client.post(path, json={"text_1": text_1, "text_2": text_2}).json()
    assert body["object"] == "list" and body["model"] == "fake-rerank" and isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == list(range(len(pairs)))
    assert [d["object"] for d in body["data"]] == ["score"] * len(pairs)
    assert [d["score"] for d in body["data"]] == pytest.approx([expected_score(a, b) for a, b in pairs])
    tokens = sum(len(encode(a)) + 1 + len(encode(b)) for a, b in pairs)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}


def test_classify_gives_probabilities_over_the_models_labels(served):
    client, engines = served
    body = client.post("/classify", json={"input": ["aaa", "abc"]}, headers={"X-Request-Id": "c"}).json()
    assert body["id"] == "classify-c" and body["model"] == "fake-classify" and body["object"] == "list"
    for item in body["data"]:
        assert item["num_classes"] == 3 and sum(item["probs"]) == pytest.approx(1.0)
        best = max(range(3), key=item["probs"].__getitem__)
        assert item["label"] == ("negative", "neutral", "positive")[best]
    tokens = 1 + len(encode("aaa")) + 1 + len(encode("abc"))  # each with the tokenizer's bos
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
    ids = client.post("/classify", json={"input": [5, 6, 7]}).json()
    assert ids["data"][0]["num_classes"] == 3 and engines["classify"].classified[-1][0].token_ids == [5, 6, 7]
    logits = client.post("/classify", json={"input": "aaa", "use_activation": False}).json()["data"][0]["probs"]
    assert sorted(logits) != pytest.approx(sorted(body["data"][0]["probs"])) and sum(logits) == 1 + len(encode("aaa"))


LONG = "x" * 80  # past the fake pooling engines' 64-token context


@pytest.mark.parametrize("path, body, param", [
    ("/rerank", {"query": "q", "documents": []}, "documents"),
    ("/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ("/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ("/rerank", {"query": "q", "documents": ["a"] * 5}, "documents"),  # CHOIR_MAX_PROMPTS is 4 here
    ("/rerank", {"query": "q", "documents": ["a", LONG]}, "documents[1]"),
    ("/rerank", {"query": LONG, "documents": ["a"]}, "query"),  # too long by itself
    ("/rerank", {"query": "q" * 40, "documents": ["a" * 40]}, "documents[0]"),  # the pair is too long
    ("/rerank", {"query": "q", "documents": LONG}, "documents"),
    ("/rerank", {"query": "q", "documents": ["a"], "truncate_prompt_tokens": 5}, "truncate_prompt_tokens"),
    ("/rerank", {"query": "q", "documents": ["a"], "max_tokens_per_query": 5}, "max_tokens_per_query"),
    ("/score", {"text_1": LONG, "text_2": "b"}, "text_1"),
    ("/rerank", {"query": "q", "documents": ["a"], "model": "fake-model"}, "model"),
    ("/rerank", {"query": "q", "documents": ["a"], "model": "fake-embed"}, "model"),
    ("/rerank", {"query": "q", "documents": ["a"], "model": "nope"}, "model"),
    ("/rerank", {"query": "q", "documents": [{"title": "a"}]}, "documents[0].text"),
    ("/rerank", {"documents": ["a"]}, "query"),
    ("/rerank", {"query": "q", "documents": ["a"], "priority": 3}, "priority"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ("/score", {"text_1": [], "text_2": ["a"]}, "text_1"),
    ("/score", {"text_1": "a", "text_2": []}, "text_2"),
    ("/score", {"text_1": "a", "text_2": ["b", LONG]}, "text_2[1]"),
    ("/score", {"text_1": "a", "text_2": LONG}, "text_2"),
    ("/score", {"text_1": "a", "text_2": "b", "model": "fake-classify"}, "model"),
    ("/classify", {"input": []}, "input"),
    ("/classify", {"input": ["a", LONG]}, "input[1]"),
    ("/classify", {"input": "a", "model": "fake-rerank"}, "model"),
    ("/classify", {"input": "a", "model": "fake-model"}, "model"),
    ("/classify", {"input": [{"a": 1}]}, "input"),
])
def test_bad_input_is_a_400_naming_the_field(path, body, param):
    client, engines = make_client(max_prompts=4)
    with client:
        before = {role: len(engine.classified) for role, engine in engines.items()}
        response = client.post(path, json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param, response.text
        assert {role: len(engine.classified) for role, engine in engines.items()} == before  # nothing ran


def test_a_generation_endpoint_points_a_rerank_model_to_rerank(served):
    client, _ = served
    error = client.post("/v1/chat/completions", json={"model": "fake-rerank", "messages": [
        {"role": "user", "content": "hi"}]}).json()["error"]
    assert error["param"] == "model" and "/rerank" in error["message"]
    assert client.post("/v1/embeddings", json={"model": "fake-classify", "input": "x"}).json()["error"]["param"] == \
        "model"


@pytest.mark.parametrize("path, body, variable", [
    ("/rerank", {"query": "q", "documents": ["a"]}, "CHOIR_RERANK_MODEL"),
    ("/score", {"text_1": "q", "text_2": "a"}, "CHOIR_RERANK_MODEL"),
    ("/classify", {"input": "a"}, "CHOIR_CLASSIFY_MODEL"),
])
def test_without_the_roles_model_the_endpoint_is_a_404_naming_its_setting(path, body, variable):
    client, _ = make_client(roles=("embed",))
    with client:
        response = client.post(path, json=body)
        assert response.status_code == 404 and variable in response.json()["error"]["message"]


def test_every_role_is_listed_healthy_and_tokenizes(served):
    client, engines = served
    assert [card["id"] for card in client.get("/v1/models").json()["data"]] == [
        "fake-model", "fake-embed", "fake-rerank", "fake-classify"]
    assert client.get("/health").json()["status"] == "ok"
    tokens = client.post("/tokenize", json={"model": "fake-rerank", "prompt": "ab"}).json()["tokens"]
    assert tokens == [0, *encode("ab")]
    engines["classify"].is_alive = False
    try:
        response = client.get("/health")
        assert response.status_code == 503 and "classify" in response.json()["error"]["message"]
    finally:
        engines["classify"].is_alive = True


def test_the_pooling_endpoints_need_the_key():
    client, _ = make_client(api_keys=("k",))
    with client:
        for path, body in [("/rerank", {"query": "q", "documents": ["a"]}), ("/v2/rerank", {}),
                           ("/score", {"text_1": "a", "text_2": "b"}), ("/classify", {"input": "a"})]:
            assert client.post(path, json=body).status_code == 401
        assert client.post("/rerank", json={"query": "q", "documents": ["a"]},
                           headers={"Authorization": "Bearer k"}).status_code == 200
