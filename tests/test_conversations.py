"""The Conversations API, and responses that continue a conversation or a chain of responses, over a fake
engine and a real store (SQLite, and PostgreSQL under `make test`)."""

import asyncio

import pytest
from litestar.testing import AsyncTestClient, TestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from tests.fakes import FakeEngine, fake_engine_factory
from tests.sse import sse_payloads

CONVERSATIONS = "/v1/conversations"
RESPONSES = "/v1/responses"


def make_app(store_url, max_model_len=1024, delay=0.0, **settings):
    engine = FakeEngine(max_model_len=max_model_len, delay=delay)
    app = create_app(Settings(served_model_name="fake-model", store_url=store_url, **settings),
                     engine_factory=fake_engine_factory(engine))
    return app, engine


@pytest.fixture
def served(store_url):
    app, engine = make_app(store_url)
    with TestClient(app) as client:
        yield client, engine


def texts(items):
    return [part["text"] for item in items for part in item.get("content", [])]


def test_a_conversation_is_created_read_updated_and_deleted(served):
    client, _ = served
    created = client.post(CONVERSATIONS, json={"items": [{"role": "user", "content": "hello"}],
                                               "metadata": {"topic": "demo"}})
    assert created.status_code == 200
    conversation = created.json()
    assert conversation["object"] == "conversation" and conversation["id"].startswith("conv_")
    assert conversation["metadata"] == {"topic": "demo"} and isinstance(conversation["created_at"], int)
    path = f"{CONVERSATIONS}/{conversation['id']}"
    assert client.get(path).json() == conversation
    updated = client.post(path, json={"metadata": {"topic": "other"}}).json()
    assert updated["metadata"] == {"topic": "other"}
    assert client.post(path, json={"metadata": None}).json()["metadata"] == {}
    deleted = client.delete(path)
    assert deleted.json() == {"id": conversation["id"], "object": "conversation.deleted", "deleted": True}
    for response in (client.get(path), client.delete(path), client.get(f"{path}/items"),
                     client.post(f"{path}/items", json={"items": [{"role": "user", "content": "x"}]})):
        assert response.status_code == 404 and response.json()["error"]["param"] == "conversation_id"


def test_items_are_added_paged_read_and_deleted(served):
    client, _ = served
    conversation = client.post(CONVERSATIONS, json={}).json()
    path = f"{CONVERSATIONS}/{conversation['id']}/items"
    added = client.post(path, json={"items": [{"role": "user", "content": f"m{i}"} for i in range(5)]}).json()
    assert added["object"] == "list" and texts(added["data"]) == [f"m{i}" for i in range(5)]
    assert all(item["id"].startswith("msg_") and item["status"] == "completed" for item in added["data"])
    newest = client.get(path, params={"limit": 2}).json()  # desc by default
    assert texts(newest["data"]) == ["m4", "m3"] and newest["has_more"] is True
    rest = client.get(path, params={"limit": 2, "after": newest["last_id"]}).json()
    assert texts(rest["data"]) == ["m2", "m1"] and rest["has_more"] is True
    back = client.get(path, params={"limit": 2, "before": rest["first_id"]}).json()  # an older client's cursor
    assert texts(back["data"]) == ["m4", "m3"] and back["has_more"] is False
    m3 = added["data"][3]["id"]
    back_asc = client.get(path, params={"limit": 2, "before": m3, "order": "asc"}).json()
    assert texts(back_asc["data"]) == ["m1", "m2"] and back_asc["has_more"] is True
    oldest = client.get(path, params={"order": "asc", "limit": 100}).json()
    assert texts(oldest["data"]) == [f"m{i}" for i in range(5)] and oldest["has_more"] is False
    second = added["data"][1]
    assert client.get(f"{path}/{second['id']}").json() == second
    after_delete = client.delete(f"{path}/{second['id']}")
    assert after_delete.status_code == 200 and after_delete.json()["id"] == conversation["id"]
    assert client.get(f"{path}/{second['id']}").status_code == 404
    assert client.delete(f"{path}/{second['id']}").json()["error"]["param"] == "item_id"
    assert texts(client.get(path, params={"order": "asc"}).json()["data"]) == ["m0", "m2", "m3", "m4"]


@pytest.mark.parametrize(("body", "param"), [
    ({"items": [{"role": "user", "content": "x"}] * 21}, "items"),
    ({"items": [{"type": "image_generation_call"}]}, "items[0].type"),
    ({"items": [{"type": "message", "role": "user"}]}, "items[0]"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
])
def test_bad_conversation_bodies_are_400s_naming_the_field(served, body, param):
    client, _ = served
    response = client.post(CONVERSATIONS, json=body)
    assert response.status_code == 400 and response.json()["error"]["param"].startswith(param)


def test_a_response_continues_a_conversation_and_adds_its_turn(served):
    client, engine = served
    conversation = client.post(CONVERSATIONS, json={"items": [{"role": "user", "content": "earlier"}]}).json()
    first = client.post(RESPONSES, json={"input": "now", "conversation": conversation["id"],
                                         "instructions": "be brief"}).json()
    assert first["conversation"] == {"id": conversation["id"]} and first["status"] == "completed"
    assert engine.calls[-1].prompt.text == "<system>be brief<user>earlier<user>now<assistant>"
    items = client.get(f"{CONVERSATIONS}/{conversation['id']}/items", params={"order": "asc"}).json()["data"]
    assert [item["role"] for item in items] == ["user", "user", "assistant"]
    assert items[-1]["id"] == first["output"][0]["id"] and texts(items[-1:]) == ["Hello world!"]
    streamed = client.post(RESPONSES, json={"input": "again", "conversation": {"id": conversation["id"]},
                                            "stream": True})
    assert any('"response.completed"' in payload for payload in sse_payloads(streamed.text))
    assert engine.calls[-1].prompt.text == ("<user>earlier<user>now<assistant>Hello world!<user>again<assistant>")
    assert len(client.get(f"{CONVERSATIONS}/{conversation['id']}/items").json()["data"]) == 5
    unstored = client.post(RESPONSES, json={"input": "x", "conversation": conversation["id"], "store": False})
    assert unstored.status_code == 200  # the response is not kept, its turn is
    assert client.get(f"{RESPONSES}/{unstored.json()['id']}").status_code == 404
    assert len(client.get(f"{CONVERSATIONS}/{conversation['id']}/items").json()["data"]) == 7


def test_conversation_errors(store_url):
    app, engine = make_app(store_url, api_keys=("key-a", "key-b"))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    with TestClient(app) as client:
        conversation = client.post(CONVERSATIONS, json={}, headers=a).json()
        for response in (client.get(f"{CONVERSATIONS}/{conversation['id']}", headers=b),
                         client.post(RESPONSES, json={"input": "x", "conversation": conversation["id"]}, headers=b)):
            assert response.status_code == 404  # another key's
        unknown = client.post(RESPONSES, json={"input": "x", "conversation": "conv_nope"}, headers=a)
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "conversation"
        first = client.post(RESPONSES, json={"input": "x"}, headers=a).json()
        both = client.post(RESPONSES, json={"input": "x", "conversation": conversation["id"],
                                            "previous_response_id": first["id"]}, headers=a)
        assert both.status_code == 400 and both.json()["error"]["param"] == "previous_response_id"
        assert engine.calls and len(engine.calls) == 1
    stateless, _ = make_app(None)
    with TestClient(stateless) as client:
        assert client.post(CONVERSATIONS, json={}).status_code == 400
        assert client.get(f"{CONVERSATIONS}/conv_x").status_code == 404
        refused = client.post(RESPONSES, json={"input": "x", "conversation": "conv_x"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "conversation"


async def test_two_responses_at_once_in_one_conversation_each_add_their_turn_whole(store_url):
    app, _ = make_app(store_url, delay=0.01)
    async with AsyncTestClient(app) as client:
        conversation = (await client.post(CONVERSATIONS, json={})).json()
        answers = await asyncio.gather(*(client.post(RESPONSES, json={"input": text, "conversation":
                                                                       conversation["id"]})
                                         for text in ("one", "two")))
        assert all(answer.status_code == 200 for answer in answers)
        items = (await client.get(f"{CONVERSATIONS}/{conversation['id']}/items",
                                  params={"order": "asc"})).json()["data"]
    assert len(items) == 4
    turns = [texts(items[:2]), texts(items[2:])]
    assert sorted(turns) == [["one", "Hello world!"], ["two", "Hello world!"]]


async def test_two_continuations_of_one_response_both_succeed_each_on_its_own_branch(store_url):
    app, engine = make_app(store_url, delay=0.01)
    async with AsyncTestClient(app) as client:
        first = (await client.post(RESPONSES, json={"input": "root"})).json()
        left, right = await asyncio.gather(*(client.post(RESPONSES, json={"input": text, "previous_response_id":
                                                                          first["id"]})
                                             for text in ("left", "right")))
        assert left.status_code == right.status_code == 200
        await client.post(RESPONSES, json={"input": "more", "previous_response_id": left.json()["id"]})
    assert engine.calls[-1].prompt.text == ("<user>root<assistant>Hello world!<user>left<assistant>Hello world!"
                                            "<user>more<assistant>")


def test_truncation_auto_drops_the_oldest_turns_and_disabled_is_a_400(store_url):
    app, engine = make_app(store_url, max_model_len=60)
    with TestClient(app) as client:
        previous = None
        for text in ("first turn", "second turn", "third turn"):
            body = {"input": text, "truncation": "auto", **({"previous_response_id": previous} if previous else {})}
            response = client.post(RESPONSES, json=body)
            assert response.status_code == 200, response.text
            previous = response.json()["id"]
        prompt = engine.calls[-1].prompt.text
        assert "third turn" in prompt and "first turn" not in prompt and prompt.startswith("<user>")
        refused = client.post(RESPONSES, json={"input": "fourth", "previous_response_id": previous})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "previous_response_id"
        assert "truncation" in refused.json()["error"]["message"]
        alone = client.post(RESPONSES, json={"input": "x" * 400, "truncation": "auto",
                                             "previous_response_id": previous})
        assert alone.status_code == 400 and alone.json()["error"]["param"] == "input"


def test_a_deleted_turn_breaks_the_chain_with_a_404_naming_it(served):
    client, _ = served
    first = client.post(RESPONSES, json={"input": "one"}).json()
    second = client.post(RESPONSES, json={"input": "two", "previous_response_id": first["id"]}).json()
    assert client.delete(f"{RESPONSES}/{first['id']}").status_code == 200
    broken = client.post(RESPONSES, json={"input": "three", "previous_response_id": second["id"]})
    assert broken.status_code == 404 and first["id"] in broken.json()["error"]["message"]
    assert broken.json()["error"]["param"] == "previous_response_id"


def test_item_ids_are_the_clients_and_unique_within_a_conversation(served):
    client, _ = served
    item = {"type": "message", "role": "user", "content": "x", "id": "msg_mine"}
    conversation = client.post(CONVERSATIONS, json={"items": [item, item]}).json()
    listed = client.get(f"{CONVERSATIONS}/{conversation['id']}/items", params={"order": "asc"}).json()["data"]
    assert listed[0]["id"] == "msg_mine" and listed[1]["id"].startswith("msg_") and listed[1]["id"] != "msg_mine"
    other = client.post(CONVERSATIONS, json={"items": [item]}).json()  # another conversation may use it too
    assert client.get(f"{CONVERSATIONS}/{other['id']}/items/msg_mine").status_code == 200
    first = client.post(RESPONSES, json={"input": "hi", "conversation": conversation["id"]}).json()
    again = client.post(RESPONSES, json={"input": first["output"], "conversation": conversation["id"]})
    assert again.status_code == 200  # its output sent back as input: stored again under new ids
    long = client.post(CONVERSATIONS, json={"items": [{**item, "id": "x" * 257}]})
    assert long.status_code == 400 and long.json()["error"]["param"] == "items[0].id"


def test_input_items_take_after_and_before_together(served):
    client, _ = served
    created = client.post(RESPONSES, json={"input": [{"role": "user", "content": f"m{i}"} for i in range(5)]}).json()
    items = client.get(f"{RESPONSES}/{created['id']}/input_items", params={"order": "asc"}).json()["data"]
    between = client.get(f"{RESPONSES}/{created['id']}/input_items", params={
        "order": "asc", "after": items[0]["id"], "before": items[4]["id"], "limit": 2}).json()
    assert texts(between["data"]) == ["m2", "m3"] and between["has_more"] is True


def test_a_chain_is_read_to_its_limit(store_url, monkeypatch):
    from choir.plugins.store import responses

    monkeypatch.setattr(responses, "MAX_CHAIN", 3)
    monkeypatch.setattr("choir.app.serving.stored.MAX_CHAIN", 3)
    app, _ = make_app(store_url)
    with TestClient(app) as client:
        previous = None
        for turn in range(4):  # the fourth continues three turns: the most the query reads
            body = {"input": f"t{turn}", **({"previous_response_id": previous} if previous else {})}
            previous = client.post(RESPONSES, json=body).json()["id"]
        refused = client.post(RESPONSES, json={"input": "t4", "previous_response_id": previous})
        assert refused.status_code == 400 and "3 turns" in refused.json()["error"]["message"]
        store = client.app.state["store"].responses
        body = {"id": "resp_loop", "object": "response", "created_at": 0, "status": "completed", "model": "m",
                "output": []}
        client.blocking_portal.call(store.save, "", body, [], ["resp_loop"])  # a cycle: the query still ends
        looped = client.post(RESPONSES, json={"input": "x", "previous_response_id": "resp_loop"})
        assert looped.status_code == 400


def test_truncation_auto_keeps_room_for_max_output_tokens(store_url):
    app, engine = make_app(store_url, max_model_len=80)
    with TestClient(app) as client:
        previous = None
        for text in ("first turn", "second turn", "third turn"):
            body = {"input": text, "truncation": "auto", "max_output_tokens": 30,
                    **({"previous_response_id": previous} if previous else {})}
            response = client.post(RESPONSES, json=body)
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["input_tokens"] + 30 <= 80
            previous = response.json()["id"]
