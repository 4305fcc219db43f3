"""Background responses over a fake engine and a real store (SQLite, and PostgreSQL under `make test`):
queued then made apart from the request, polled, streamed again from any event, cancelled, and stopped
cleanly when the server stops."""

import json
import time

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from tests.fakes import FakeEngine, fake_engine_factory
from tests.sse import sse_payloads

PATH = "/v1/responses"
PIECES = [f" w{i}" for i in range(30)]


def make_client(store_url, delay=0.0, **settings):
    engine = FakeEngine(max_model_len=1024, delay=delay, script=lambda prompt, params: PIECES)
    app = create_app(Settings(served_model_name="fake-model", store_url=store_url, **settings),
                     engine_factory=fake_engine_factory(engine))
    return TestClient(app), engine


def wait_for(client, response_id, statuses=("completed", "incomplete", "failed", "cancelled"), headers=None):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        body = client.get(f"{PATH}/{response_id}", headers=headers).json()
        if body["status"] in statuses:
            return body
        time.sleep(0.02)
    raise AssertionError(f"{response_id} stayed {body['status']}")


def events_of(text):
    return [json.loads(payload) for payload in sse_payloads(text)]


def test_a_background_response_is_queued_then_polled_to_its_end(store_url):
    client, engine = make_client(store_url, delay=0.01)
    with client:
        queued = client.post(PATH, json={"input": "hi", "background": True})
        assert queued.status_code == 200
        body = queued.json()
        assert body["status"] == "queued" and body["background"] is True and body["output"] == []
        done = wait_for(client, body["id"])
        assert done["status"] == "completed" and done["background"] is True
        assert done["output"][0]["content"][0]["text"] == "".join(PIECES)
        items = client.get(f"{PATH}/{body['id']}/input_items").json()["data"]
        assert items[0]["content"] == [{"type": "input_text", "text": "hi"}]
        # continued like any stored response
        client.post(PATH, json={"input": "next", "previous_response_id": body["id"]})
        assert "".join(PIECES) in engine.calls[-1].prompt.text


def test_a_background_stream_is_replayed_whole_or_after_an_event(store_url):
    client, _ = make_client(store_url)
    with client:
        streamed = client.post(PATH, json={"input": "hi", "background": True, "stream": True})
        assert streamed.status_code == 200
        events = events_of(streamed.text)
        assert events[0]["type"] == "response.created" and events[0]["response"]["status"] == "queued"
        assert events[-1]["type"] == "response.completed"
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        response_id = events[0]["response"]["id"]
        wait_for(client, response_id)
        again = client.get(f"{PATH}/{response_id}", params={"stream": "true"})
        assert again.status_code == 200 and events_of(again.text) == events
        after = client.get(f"{PATH}/{response_id}", params={"stream": "true", "starting_after": 5})
        assert events_of(after.text) == events[6:]


def test_a_stream_on_another_process_follows_the_stored_events(store_url):
    """The run is made here, but the stream reads the store (as a stream on another API process does)."""
    client, _ = make_client(store_url, delay=0.02)
    with client:
        response_id = client.post(PATH, json={"input": "hi", "background": True}).json()["id"]
        runs = client.app.state["store"].runs
        run = runs.runs.pop(response_id, None)  # this process no longer knows it: the store is read
        followed = client.get(f"{PATH}/{response_id}", params={"stream": "true"})
        events = events_of(followed.text)
        assert events[-1]["type"] == "response.completed"
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        if run is not None:
            assert [json.loads(data) for _, _, data in run.events] == events


def test_cancel_stops_a_background_response_and_is_idempotent(store_url):
    client, engine = make_client(store_url, delay=0.05)
    with client:
        response_id = client.post(PATH, json={"input": "hi", "background": True}).json()["id"]
        wait_for(client, response_id, ("in_progress",))
        cancelled = client.post(f"{PATH}/{response_id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        deadline = time.monotonic() + 5
        while not engine.aborted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.aborted  # the generation stopped
        assert client.get(f"{PATH}/{response_id}").json()["status"] == "cancelled"
        again = client.post(f"{PATH}/{response_id}/cancel")
        assert again.status_code == 200 and again.json()["status"] == "cancelled"
        replay = events_of(client.get(f"{PATH}/{response_id}", params={"stream": "true"}).text)
        assert not any(event["type"] in ("response.completed", "response.failed") for event in replay)


def test_cancelling_an_ended_background_response_returns_it_as_it_ended(store_url):
    client, _ = make_client(store_url)
    with client:
        response_id = client.post(PATH, json={"input": "hi", "background": True}).json()["id"]
        wait_for(client, response_id)
        cancelled = client.post(f"{PATH}/{response_id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "completed"


def test_background_errors(store_url, tmp_path):
    client, _ = make_client(store_url, api_keys=("key-a", "key-b"))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    with client:
        plain = client.post(PATH, json={"input": "hi"}, headers=a).json()
        refused = client.post(f"{PATH}/{plain['id']}/cancel", headers=a)
        assert refused.status_code == 400 and "background" in refused.json()["error"]["message"]
        not_streamed = client.get(f"{PATH}/{plain['id']}", params={"stream": "true"}, headers=a)
        assert not_streamed.status_code == 400 and not_streamed.json()["error"]["param"] == "stream"
        assert client.post(f"{PATH}/resp_nope/cancel", headers=a).status_code == 404
        background = client.post(PATH, json={"input": "hi", "background": True}, headers=a).json()
        for response in (client.post(f"{PATH}/{background['id']}/cancel", headers=b),
                         client.get(f"{PATH}/{background['id']}", params={"stream": "true"}, headers=b)):
            assert response.status_code == 404  # another key's
        unstored = client.post(PATH, json={"input": "hi", "background": True, "store": False}, headers=a)
        assert unstored.status_code == 400 and unstored.json()["error"]["param"] == "background"
        wait_for(client, background["id"], headers=a)
    stateless, _ = make_client(None)
    with stateless:
        response = stateless.post(PATH, json={"input": "hi", "background": True})
        assert response.status_code == 400 and response.json()["error"]["param"] == "background"


def test_a_background_response_the_server_stops_is_stored_as_failed(store_url):
    client, _ = make_client(store_url, delay=0.1)
    with client:
        response_id = client.post(PATH, json={"input": "hi", "background": True}).json()["id"]
        wait_for(client, response_id, ("in_progress",))
    again, _ = make_client(store_url)
    with again:
        body = again.get(f"{PATH}/{response_id}").json()
        assert body["status"] == "failed" and "stopped" in body["error"]["message"]
        events = events_of(again.get(f"{PATH}/{response_id}", params={"stream": "true"}).text)
        assert events[-1]["type"] == "response.failed"


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_background_response_says_so(store_url, stream):
    client, engine = make_client(store_url)

    def broken(prompt, params):
        raise RuntimeError("engine exploded")

    engine.script = broken
    with client:
        created = client.post(PATH, json={"input": "hi", "background": True, "stream": stream})
        assert created.status_code == 200
        response_id = (events_of(created.text)[0]["response"]["id"] if stream else created.json()["id"])
        body = wait_for(client, response_id)
        assert body["status"] == "failed" and "exploded" not in json.dumps(body)


def test_a_cancel_stored_by_another_process_stops_the_run_without_a_last_event(store_url):
    """The cancel lands in the store only (as from another API process): the run learns of it at its next batch
    (a background response is made as a stream even when no client follows it) and writes nothing more."""
    client, engine = make_client(store_url, delay=0.05)
    with client:
        response_id = client.post(PATH, json={"input": "hi", "background": True}).json()["id"]
        wait_for(client, response_id, ("in_progress",))
        store = client.app.state["store"]
        run = store.runs.runs[response_id]
        _, took_effect = client.blocking_portal.call(store.responses.cancel, "", response_id)
        assert took_effect
        deadline = time.monotonic() + 5
        while not engine.aborted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.aborted and run.done
        assert not [name for _, name, _ in run.events if name in ("response.completed", "response.failed")]
        assert client.get(f"{PATH}/{response_id}").json()["status"] == "cancelled"


def test_a_local_cancel_sends_no_failed_event_to_the_streams_that_follow(store_url):
    client, engine = make_client(store_url, delay=0.05)
    with client:
        response_id = client.post(PATH, json={"input": "hi", "background": True}).json()["id"]
        wait_for(client, response_id, ("in_progress",))
        run = client.app.state["store"].runs.runs[response_id]
        assert client.post(f"{PATH}/{response_id}/cancel").json()["status"] == "cancelled"
        deadline = time.monotonic() + 5
        while not run.done and time.monotonic() < deadline:
            time.sleep(0.02)
        assert run.done and "response.failed" not in [name for _, name, _ in run.events]


def test_a_background_response_in_a_conversation_adds_its_turn_with_its_end_and_not_when_cancelled(store_url):
    client, _ = make_client(store_url, delay=0.02)
    with client:
        conversation = client.post("/v1/conversations", json={}).json()["id"]
        items = f"/v1/conversations/{conversation}/items"
        done = client.post(PATH, json={"input": "hi", "background": True, "conversation": conversation}).json()
        ended = wait_for(client, done["id"])
        listed = client.get(items, params={"order": "asc"}).json()["data"]
        assert ended["status"] == "completed" and [item["role"] for item in listed] == ["user", "assistant"]
        stopped = client.post(PATH, json={"input": "again", "background": True, "conversation": conversation})
        wait_for(client, stopped.json()["id"], ("in_progress",))
        client.post(f"{PATH}/{stopped.json()['id']}/cancel")
        time.sleep(0.3)
        assert len(client.get(items).json()["data"]) == 2  # the cancelled turn is not added


def test_an_unfinished_background_response_cannot_be_continued(store_url):
    client, _ = make_client(store_url, delay=0.05)
    with client:
        response_id = client.post(PATH, json={"input": "hi", "background": True}).json()["id"]
        early = client.post(PATH, json={"input": "next", "previous_response_id": response_id})
        assert early.status_code == 400 and early.json()["error"]["param"] == "previous_response_id"
        client.post(f"{PATH}/{response_id}/cancel")


def test_an_orphaned_background_response_is_reaped_as_failed(store_url):
    """Its process died (no heartbeat for STALE_SECONDS): a GET stores it as failed, a stream ends."""
    from choir.plugins.store.responses import STALE_SECONDS

    client, _ = make_client(store_url)
    with client:
        responses = client.app.state["store"].responses
        body = {"id": "resp_orphan", "object": "response", "created_at": 0, "status": "in_progress", "model": "m",
                "output": [], "background": True}
        client.blocking_portal.call(responses.save, "", body, [])

        async def age() -> None:
            from sqlalchemy import update

            from choir.plugins.store.models import StoredResponse

            async with responses.session() as session:
                await session.execute(update(StoredResponse).values(heartbeat_at=int(time.time()) - STALE_SECONDS - 1))
                await session.commit()

        client.blocking_portal.call(age)
        assert client.get(f"{PATH}/resp_orphan", params={"stream": "true"}).status_code == 200  # it ends
        reaped = client.get(f"{PATH}/resp_orphan").json()
        assert reaped["status"] == "failed" and "stopped" in reaped["error"]["message"]


def test_a_store_gone_mid_run_loses_nothing_and_the_end_is_stored_once_it_is_back(store_url):
    """The store goes away while a background response is made: the run goes on, its events wait, and once the
    store is back its final state and every event are stored (replayed whole, in order)."""
    from sqlalchemy.exc import OperationalError

    client, engine = make_client(store_url, delay=0.02)
    with client:
        responses = client.app.state["store"].responses
        sessions = responses.sessions

        def down():
            raise OperationalError("connect", {}, OSError("database is down"))

        response_id = client.post(PATH, json={"input": "hi", "background": True}).json()["id"]
        deadline = time.monotonic() + 20
        while client.get(f"{PATH}/{response_id}").json()["status"] == "queued":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        responses.sessions = down
        assert client.get(f"{PATH}/{response_id}").status_code == 503
        time.sleep(len(PIECES) * 0.02 + 0.5)  # the generation ends meanwhile; its final state waits
        assert client.get(f"{PATH}/{response_id}").status_code == 503
        responses.sessions = sessions
        done = wait_for(client, response_id)
        assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == "".join(PIECES)
        events = events_of(client.get(f"{PATH}/{response_id}", params={"stream": "true"}).text)
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        assert events[-1]["type"] == "response.completed"
        assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "".join(PIECES)
