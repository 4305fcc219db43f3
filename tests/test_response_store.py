"""Stored responses over a fake engine and a real SQLite store (a file per test): store, retrieve, delete,
input items, previous_response_id, ownership by API key, CHOIR_STORE=off, and a store that is down."""

import pytest
from litestar.testing import TestClient
from sqlalchemy.exc import OperationalError

from choir.app.asgi import create_app
from choir.core.settings import Settings
from tests.fakes import FakeEngine, fake_engine_factory
from tests.sse import sse_payloads

PATH = "/v1/responses"


def make_client(url, max_model_len=1024, **settings):
    """`url`: the store's (the `store_url` fixture: SQLite, then PostgreSQL), None: no store."""
    engine = FakeEngine(max_model_len=max_model_len)
    app = create_app(Settings(served_model_name="fake-model", store_url=url, **settings),
                     engine_factory=fake_engine_factory(engine))
    return TestClient(app), engine


@pytest.fixture
def served(store_url):
    client, engine = make_client(store_url)
    with client:
        yield client, engine


def test_a_response_is_stored_retrieved_and_deleted(served):
    client, _ = served
    created = client.post(PATH, json={"input": "hi", "instructions": "be brief"}).json()
    assert created["store"] is True and created["status"] == "completed"
    got = client.get(f"{PATH}/{created['id']}")
    assert got.status_code == 200 and got.json() == created
    items = client.get(f"{PATH}/{created['id']}/input_items").json()
    assert items["object"] == "list" and items["has_more"] is False
    [item] = items["data"]
    assert item["type"] == "message" and item["role"] == "user" and item["id"].startswith("msg_")
    assert item["content"] == [{"type": "input_text", "text": "hi"}]
    assert items["first_id"] == items["last_id"] == item["id"]
    deleted = client.delete(f"{PATH}/{created['id']}")
    assert deleted.status_code == 200 and deleted.json() == {"id": created["id"], "object": "response",
                                                             "deleted": True}
    for response in (client.get(f"{PATH}/{created['id']}"), client.delete(f"{PATH}/{created['id']}"),
                     client.get(f"{PATH}/{created['id']}/input_items")):
        assert response.status_code == 404 and response.json()["error"]["param"] == "response_id"


def test_store_false_stores_nothing(served):
    client, _ = served
    created = client.post(PATH, json={"input": "hi", "store": False}).json()
    assert created["store"] is False
    assert client.get(f"{PATH}/{created['id']}").status_code == 404


def test_previous_response_id_continues_the_conversation_without_its_instructions(served):
    client, engine = served
    first = client.post(PATH, json={"input": "first question", "instructions": "be brief"}).json()
    second = client.post(PATH, json={"input": "second question", "previous_response_id": first["id"],
                                     "instructions": "be kind"}).json()
    assert second["previous_response_id"] == first["id"] and second["status"] == "completed"
    answer = first["output"][0]["content"][0]["text"]
    assert engine.calls[-1].prompt.text == (f"<system>be kind<user>first question<assistant>{answer}"
                                            "<user>second question<assistant>")
    third = client.post(PATH, json={"input": "third", "previous_response_id": second["id"], "stream": True})
    assert third.status_code == 200
    assert engine.calls[-1].prompt.text.startswith("<user>first question<assistant>")
    assert "<user>second question<assistant>" in engine.calls[-1].prompt.text
    completed = [p for p in sse_payloads(third.text) if '"response.completed"' in p]
    assert completed and '"store":true' in completed[0]


def test_a_streamed_response_is_stored_before_its_last_event(served):
    client, _ = served
    streamed = client.post(PATH, json={"input": "hi", "stream": True}, headers={"X-Request-Id": "s1"})
    assert streamed.status_code == 200
    stored = client.get(f"{PATH}/resp_s1").json()
    assert stored["status"] == "completed" and stored["store"] is True


def test_a_continued_conversation_over_the_context_is_a_400_naming_previous_response_id(store_url):
    client, _ = make_client(store_url, max_model_len=64)
    with client:
        first = client.post(PATH, json={"input": "first question"}).json()
        response = client.post(PATH, json={"input": "second", "previous_response_id": first["id"]})
        assert response.status_code == 400 and response.json()["error"]["param"] == "previous_response_id"
        assert client.post(PATH, json={"input": "second"}).status_code == 200  # fits without the conversation


def test_unknown_previous_response_id_is_a_404(served):
    client, engine = served
    response = client.post(PATH, json={"input": "x", "previous_response_id": "resp_nope"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "previous_response_id"
    assert engine.calls == []


def test_input_items_pages_as_openai(served):
    client, _ = served
    items = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    created = client.post(PATH, json={"input": items}).json()
    base = f"{PATH}/{created['id']}/input_items"
    newest = client.get(base, params={"limit": 2}).json()  # desc by default
    assert [i["content"][0]["text"] for i in newest["data"]] == ["m4", "m3"] and newest["has_more"] is True
    rest = client.get(base, params={"limit": 2, "after": newest["last_id"]}).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["m2", "m1"]
    back = client.get(base, params={"limit": 2, "before": rest["first_id"], "order": "desc"}).json()
    assert [i["content"][0]["text"] for i in back["data"]] == ["m4", "m3"] and back["has_more"] is False
    oldest = client.get(base, params={"order": "asc", "limit": 10}).json()
    assert [i["content"][0]["text"] for i in oldest["data"]] == [f"m{i}" for i in range(5)]
    assert oldest["has_more"] is False
    bad = client.get(base, params={"limit": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


def test_each_key_sees_only_what_it_stored(store_url):
    client, _ = make_client(store_url, api_keys=("key-a", "key-b"))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    with client:
        created = client.post(PATH, json={"input": "secret"}, headers=a).json()
        assert client.get(f"{PATH}/{created['id']}", headers=a).status_code == 200
        for response in (client.get(f"{PATH}/{created['id']}", headers=b),
                         client.delete(f"{PATH}/{created['id']}", headers=b),
                         client.post(PATH, json={"input": "x", "previous_response_id": created["id"]}, headers=b)):
            assert response.status_code == 404
        assert client.get(f"{PATH}/{created['id']}", headers=a).status_code == 200  # b's delete did nothing
        assert client.get(f"{PATH}/{created['id']}").status_code == 401


def test_without_a_store_nothing_is_kept_and_previous_response_id_is_a_400(tmp_path):
    client, _ = make_client(None)
    with client:
        created = client.post(PATH, json={"input": "hi"}).json()
        assert created["store"] is False and client.get(f"{PATH}/{created['id']}").status_code == 404
        response = client.post(PATH, json={"input": "x", "previous_response_id": created["id"]})
        assert response.status_code == 400 and response.json()["error"]["param"] == "previous_response_id"
    assert not (tmp_path / "store.sqlite3").exists()


def test_a_store_that_is_down_fails_stateful_calls_only(served):
    client, _ = served
    created = client.post(PATH, json={"input": "hi"}).json()
    store = client.app.state["store"]

    def down():
        raise OperationalError("connect", {}, OSError("database is down"))

    store.responses.sessions = store.conversations.sessions = down
    for response in (client.get(f"{PATH}/{created['id']}"), client.post(PATH, json={"input": "hi"}),
                     client.post(PATH, json={"input": "x", "previous_response_id": created["id"]}),
                     client.post(PATH, json={"input": "x", "background": True}),
                     client.post("/v1/conversations", json={}), client.get("/v1/conversations/conv_x"),
                     client.post(PATH, json={"input": "x", "conversation": "conv_x", "store": False})):
        assert response.status_code == 503 and "store" in response.json()["error"]["message"]
    assert client.post(PATH, json={"input": "hi", "store": False}).status_code == 200
    assert client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).status_code \
        == 200


def test_a_store_that_cannot_start_leaves_the_server_serving(tmp_path):
    """A database that is unreachable at start-up (here: its directory cannot be made) costs the stateful
    calls a 503, never the server its start."""
    (tmp_path / "file").write_text("not a directory")
    engine = FakeEngine(max_model_len=1024)
    app = create_app(Settings(served_model_name="fake-model", store_url=f"sqlite+aiosqlite:///{tmp_path}/file/s.db"),
                     engine_factory=fake_engine_factory(engine))
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}) \
            .status_code == 200
        assert client.post(PATH, json={"input": "hi", "store": False}).status_code == 200
        calls = len(engine.calls)
        stored = client.post(PATH, json={"input": "hi"})
        assert stored.status_code == 503 and len(engine.calls) == calls  # refused before any generation


def test_a_reused_request_id_is_a_409_before_any_generation(served):
    client, engine = served
    assert client.post(PATH, json={"input": "hi"}, headers={"X-Request-Id": "same"}).status_code == 200
    calls = len(engine.calls)
    again = client.post(PATH, json={"input": "hi"}, headers={"X-Request-Id": "same"})
    assert again.status_code == 409 and again.json()["error"]["param"] == "request_id"
    assert len(engine.calls) == calls
    assert client.post(PATH, json={"input": "hi", "store": False}, headers={"X-Request-Id": "same"}).status_code \
        == 200  # nothing to store, nothing taken


def test_every_input_item_is_carried_and_a_second_delete_is_a_404(served):
    client, engine = served
    first = client.post(PATH, json={"input": [{"role": "system", "content": "S"}, {"role": "developer",
                                                                                  "content": "D"},
                                              {"role": "user", "content": "u"}]}).json()
    client.post(PATH, json={"input": "next", "previous_response_id": first["id"]})
    assert engine.calls[-1].prompt.text.startswith("<system>S<developer>D<user>u<assistant>")
    assert client.delete(f"{PATH}/{first['id']}").status_code == 200
    assert client.delete(f"{PATH}/{first['id']}").status_code == 404


def test_a_continuation_carries_the_earlier_output_items_reasoning_included():
    from choir.app.serving.responses import messages_of

    history = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}], "id": "msg_0"},
               {"type": "reasoning", "id": "rs_1", "status": "completed", "summary": [],
                "content": [{"type": "reasoning_text", "text": "think"}]},
               {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "answer", "annotations": [], "logprobs": []}]}]
    assert messages_of(history, "input") == [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "answer", "reasoning": "think"}]


def test_a_postgresql_that_cannot_be_reached_leaves_the_server_serving():
    from tests.integration.server import free_port

    engine = FakeEngine(max_model_len=1024)
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/nothing"
    with TestClient(create_app(Settings(served_model_name="fake-model", store_url=url),
                               engine_factory=fake_engine_factory(engine))) as client:
        assert client.post(PATH, json={"input": "hi", "store": False}).status_code == 200
        for response in (client.post(PATH, json={"input": "hi"}), client.post("/v1/conversations", json={})):
            assert response.status_code == 503 and response.json()["error"]["type"]


def test_a_continued_chain_starts_its_time_to_live_again(store_url):
    client, _ = make_client(store_url, store_ttl=3600)
    with client:
        first = client.post(PATH, json={"input": "one"}).json()
        store = client.app.state["store"].responses
        before = client.blocking_portal.call(store.get, "", first["id"]).expires_at
        store.ttl = 7200
        client.post(PATH, json={"input": "two", "previous_response_id": first["id"]})
        after = client.blocking_portal.call(store.get, "", first["id"]).expires_at
        assert after >= before + 3600 - 5
