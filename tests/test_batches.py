"""The Batch API over a fake engine and a real store (SQLite, and PostgreSQL under `make test`): a batch made from
an uploaded file, checked line by line, run apart from the request, its answers in an output and an error file
exactly as the live endpoint answers; cancelled; resumed from the lines not yet answered; each key's own."""

import json
import time

from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from tests.fakes import FakeEngine, fake_engine_factory
from tests.test_errors import error_of

PATH = "/v1/batches"


def chat_line(custom_id, model="fake-model", **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": custom_id}], **body}}


def jsonl(lines) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


def make_client(url, delay=0.0, **settings):
    engine = FakeEngine(max_model_len=1024, delay=delay)
    app = create_app(Settings(served_model_name="fake-model", store_url=url, **settings),
                     engine_factory=fake_engine_factory(engine))
    return TestClient(app), engine


def upload(client, content, headers=None) -> str:
    answer = client.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"},
                         headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def create(client, file_id, endpoint="/v1/chat/completions", headers=None, **body):
    return client.post(PATH, json={"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h",
                                   **body}, headers=headers)


def wait_for(client, batch_id, statuses=("completed", "failed", "cancelled", "expired"), headers=None):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = client.get(f"{PATH}/{batch_id}", headers=headers).json()
        if body["status"] in statuses:
            return body
        time.sleep(0.05)
    raise AssertionError(f"{batch_id} stayed {body['status']}")


def lines_of(client, file_id, headers=None):
    return [json.loads(line) for line in client.get(f"/v1/files/{file_id}/content", headers=headers)
            .content.splitlines()]


def test_a_batch_runs_to_its_files_each_line_answered_as_live(store_url):
    client, engine = make_client(store_url)
    with client:
        file_id = upload(client, jsonl([chat_line("a", seed=1), chat_line("b", n=2), chat_line("c", model="nope")]))
        made = create(client, file_id, metadata={"job": "eval"})
        assert made.status_code == 200, made.text
        batch = made.json()
        assert batch["object"] == "batch" and batch["status"] == "validating" and batch["id"].startswith("batch_")
        assert batch["expires_at"] == batch["created_at"] + 24 * 3600 and batch["metadata"] == {"job": "eval"}
        done = wait_for(client, batch["id"])
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
            assert done[stamp] >= batch["created_at"]
        outputs = lines_of(client, done["output_file_id"])
        assert [line["custom_id"] for line in outputs] == ["a", "b"]
        first = outputs[0]
        assert first["id"].startswith("batch_req_") and first["error"] is None
        assert first["response"]["status_code"] == 200 and first["response"]["request_id"]
        assert first["response"]["body"]["object"] == "chat.completion"
        assert len(outputs[1]["response"]["body"]["choices"]) == 2  # fan-out, as live
        live = client.post("/v1/chat/completions", json=chat_line("a", seed=1)["body"]).json()
        assert first["response"]["body"]["choices"] == live["choices"]  # the same answer as the same request live
        [failed] = lines_of(client, done["error_file_id"])
        assert failed["custom_id"] == "c" and failed["response"]["status_code"] == 400  # as live: an unknown model
        assert failed["error"] is None and "nope" in failed["response"]["body"]["error"]["message"]  # as OpenAI's
        described = client.get(f"/v1/files/{done['output_file_id']}").json()
        assert described["purpose"] == "batch_output"
        listed = client.get(PATH).json()
        assert [b["id"] for b in listed["data"]] == [batch["id"]] and listed["has_more"] is False


def test_a_bad_input_file_fails_the_batch_naming_each_bad_line(store_url):
    client, engine = make_client(store_url)
    with client:
        file_id = upload(client, jsonl([chat_line("a"), b"{not json", {"method": "POST", "url": "/v1/chat/completions",
                                                                          "body": {}},
                                        {**chat_line("a")}, {**chat_line("d"), "url": "/v1/completions"},
                                        chat_line("e", stream=True)]))
        done = wait_for(client, create(client, file_id).json()["id"])
        assert done["status"] == "failed" and done["failed_at"] and done["output_file_id"] is None
        errors = [(error["line"], error["code"]) for error in done["errors"]["data"]]
        assert errors == [(2, "invalid_json_line"), (3, "missing_required_parameter"), (4, "duplicate_custom_id"),
                          (5, "mismatched_endpoint"), (6, "invalid_request")]
        assert engine.calls == []  # nothing was run


def test_a_batch_cancelled_mid_run_ends_cancelled_with_what_it_answered(store_url):
    client, engine = make_client(store_url, delay=0.05, batch_concurrency=1)
    with client:
        file_id = upload(client, jsonl([chat_line(f"r{i}") for i in range(40)]))
        batch_id = create(client, file_id).json()["id"]
        wait_for(client, batch_id, ("in_progress",))
        cancelling = client.post(f"{PATH}/{batch_id}/cancel")
        assert cancelling.status_code == 200 and cancelling.json()["status"] == "cancelling"
        assert cancelling.json()["cancelling_at"]
        done = wait_for(client, batch_id)
        assert done["status"] == "cancelled" and done["cancelled_at"]
        counts = done["request_counts"]
        assert counts["total"] == 40 and counts["completed"] < 40
        assert len(lines_of(client, done["output_file_id"])) == counts["completed"] if counts["completed"] else True
        assert client.post(f"{PATH}/{batch_id}/cancel").json()["status"] == "cancelled"  # idempotent


def test_an_ended_batch_cannot_be_cancelled(store_url):
    client, _ = make_client(store_url)
    with client:
        batch_id = create(client, upload(client, jsonl([chat_line("a")]))).json()["id"]
        wait_for(client, batch_id)
        assert "completed" in error_of(client.post(f"{PATH}/{batch_id}/cancel"), 409, "batch_id")


def test_a_batch_whose_process_stopped_goes_on_from_the_lines_not_answered(store_url):
    """As after a restart: the batch is in progress, its runner gone quiet, two of its five lines answered."""
    from choir.plugins.store.models import StoredBatch

    client, engine = make_client(store_url)
    with client:
        store = client.app.state["store"]
        file_id = upload(client, jsonl([chat_line(f"r{i}") for i in range(5)]))
        now = int(time.time())
        body = {"id": "batch_resumed", "object": "batch", "endpoint": "/v1/chat/completions", "input_file_id": file_id,
                "completion_window": "24h", "status": "in_progress", "created_at": now, "in_progress_at": now,
                "expires_at": now + 3600, "request_counts": {"total": 5, "completed": 2, "failed": 0}}

        async def interrupted():
            async with store.batches.session() as session:
                session.add(StoredBatch(id="batch_resumed", owner="", created_at=now, status="in_progress", body=body,
                                        runner="gone", heartbeat_at=now - 3600))
                await session.commit()
            for line in (1, 3):
                await store.batches.answer("batch_resumed", line, True, {"custom_id": f"r{line - 1}", "earlier": True})

        client.blocking_portal.call(interrupted)
        done = wait_for(client, "batch_resumed")
        assert done["status"] == "completed" and done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
        outputs = lines_of(client, done["output_file_id"])
        assert [line["custom_id"] for line in outputs] == [f"r{i}" for i in range(5)]  # in the file's order
        assert [line.get("earlier", False) for line in outputs] == [True, False, True, False, False]
        assert len(engine.calls) == 3  # the three lines not answered before, once each


def test_a_batch_past_its_window_expires_each_request_left_an_error_line(store_url):
    from choir.plugins.store.models import StoredBatch

    client, engine = make_client(store_url)
    with client:
        store = client.app.state["store"]
        file_id = upload(client, jsonl([chat_line("r0"), chat_line("r1")]))
        now = int(time.time())
        body = {"id": "batch_late", "object": "batch", "endpoint": "/v1/chat/completions", "input_file_id": file_id,
                "completion_window": "24h", "status": "in_progress", "created_at": now - 86401,
                "in_progress_at": now - 86400, "expires_at": now - 1,
                "request_counts": {"total": 2, "completed": 0, "failed": 0}}

        async def late():
            async with store.batches.session() as session:
                session.add(StoredBatch(id="batch_late", owner="", created_at=now - 86401, status="in_progress",
                                        body=body))
                await session.commit()

        client.blocking_portal.call(late)
        done = wait_for(client, "batch_late")
        assert done["status"] == "expired" and done["expired_at"] >= now and done["output_file_id"] is None
        assert done["request_counts"] == {"total": 2, "completed": 0, "failed": 2} and engine.calls == []
        assert [line["error"]["code"] for line in lines_of(client, done["error_file_id"])] == ["batch_expired"] * 2


def test_bad_requests_and_other_keys(store_url):
    client, _ = make_client(store_url, api_keys=("key-a", "key-b"))
    a, b = ({"Authorization": f"Bearer {key}"} for key in ("key-a", "key-b"))
    with client:
        file_id = upload(client, jsonl([chat_line("a")]), headers=a)
        assert "No file" in error_of(create(client, "file-nothing", headers=a), 404, "input_file_id")
        assert "No file" in error_of(create(client, file_id, headers=b), 404, "input_file_id")  # not b's file
        answer = create(client, file_id, endpoint="/v1/images", headers=a)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "endpoint"
        answer = create(client, file_id, headers=a, completion_window="1h")
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "completion_window"
        batch_id = create(client, file_id, headers=a).json()["id"]
        done = wait_for(client, batch_id, headers=a)
        assert done["status"] == "completed"
        error_of(client.get(f"{PATH}/{batch_id}", headers=b), 404, "batch_id")
        error_of(client.post(f"{PATH}/{batch_id}/cancel", headers=b), 404, "batch_id")
        error_of(client.get(f"/v1/files/{done['output_file_id']}/content", headers=b), 404, "file_id")
        assert client.get(PATH, headers=b).json()["data"] == []
        assert "limit" in error_of(client.get(PATH, params={"limit": 101}, headers=a), 400, "limit")


def test_no_store_no_batches():
    client, _ = make_client(None)
    with client:
        assert "store" in error_of(create(client, "file-x"), 400)


def test_under_priority_scheduling_a_batch_waits_behind_live_requests(store_url):
    """vLLM runs lower priorities first: a batch's chat and completions lines go at 1 (live ones at 0), unless a
    line sets its own; on an engine without priority scheduling nothing is added (it would be refused)."""
    client, engine = make_client(store_url)
    with client:
        engine.priority_scheduling = True
        file_id = upload(client, jsonl([chat_line("a"), chat_line("b", priority=-5)]))
        wait_for(client, create(client, file_id).json()["id"])
        assert sorted(call.options.priority for call in engine.calls) == [-5, 1]
        client.post("/v1/chat/completions", json=chat_line("live")["body"])
        assert engine.calls[-1].options.priority == 0
        engine.priority_scheduling, engine.calls[:] = False, []
        wait_for(client, create(client, upload(client, jsonl([chat_line("c")]))).json()["id"])
        assert [call.options.priority for call in engine.calls] == [0]


def test_lines_the_engine_refuses_for_now_are_tried_again(store_url):
    """A 503 (the engine dead, busy or stopping) is no line's fault: not stored, tried again until answered."""
    from choir.engine.protocol import EngineDead

    client, engine = make_client(store_url)
    with client:
        engine.fail_with = EngineDead("gone for now")
        batch_id = create(client, upload(client, jsonl([chat_line("a"), chat_line("b")]))).json()["id"]
        wait_for(client, batch_id, ("in_progress",))
        time.sleep(0.5)
        assert client.get(f"{PATH}/{batch_id}").json()["status"] == "in_progress"
        engine.fail_with = None
        done = wait_for(client, batch_id)
        assert done["status"] == "completed" and done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}


def test_the_input_file_is_read_as_openai_reads_it():
    from choir.app.serving.batch_input import MAX_REQUESTS, read_requests

    separator = json.dumps(chat_line("a\u2028b"), ensure_ascii=False).encode()  # a raw U+2028 inside a string
    requests, errors = read_requests(b"\xef\xbb\xbf" + separator + b"\r\n" + json.dumps(chat_line("c")).encode(),
                                     "/v1/chat/completions")
    assert errors == [] and [r.custom_id for r in requests] == ["a\u2028b", "c"]
    _, errors = read_requests(jsonl([{**chat_line("a"), "url": "/v1/responses",
                                      "body": {"input": "x", "background": True}}]), "/v1/responses")
    assert [(e.line, e.param) for e in errors] == [(1, "body.background")]
    _, errors = read_requests(jsonl([chat_line(f"r{i}") for i in range(MAX_REQUESTS + 1)]), "/v1/chat/completions")
    assert [e.code for e in errors] == ["too_many_requests"]


def test_of_two_processes_on_one_store_one_runs_a_batch(store_url):
    """Two apps on one store (as two API processes, or two replicas): each line is answered once, by the one that
    claimed the batch; both read it."""
    first, first_engine = make_client(store_url, delay=0.01)
    second, second_engine = make_client(store_url, delay=0.01)
    with first, second:
        batch_id = create(first, upload(first, jsonl([chat_line(f"r{i}") for i in range(12)]))).json()["id"]
        done = wait_for(second, batch_id)
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 12
        assert sorted([len(first_engine.calls), len(second_engine.calls)]) == [0, 12]
        assert [line["custom_id"] for line in lines_of(second, done["output_file_id"])] == [f"r{i}" for i in range(12)]


def test_an_idle_runner_looks_for_batches_less_and_less_often_and_a_new_batch_wakes_it(store_url, monkeypatch):
    """No store work an idle server does not need: the looks back off (POLL_SECONDS doubling to IDLE_POLL_SECONDS);
    a batch made here is run at once all the same."""
    from choir.app.serving import batch_runner
    from choir.plugins.store.batches import BatchStore

    monkeypatch.setattr(batch_runner, "POLL_SECONDS", 0.02)
    monkeypatch.setattr(batch_runner, "IDLE_POLL_SECONDS", 2.0)
    looks: list[float] = []
    claim = BatchStore.claim

    async def counted(self, runner):
        looks.append(time.monotonic())
        return await claim(self, runner)

    monkeypatch.setattr(BatchStore, "claim", counted)
    client, _ = make_client(store_url)
    with client:
        time.sleep(1.4)  # looks at about 0, 0.02, 0.06, 0.14, 0.30, 0.62, 1.26, then 2.54
        idle = list(looks)
        gaps = [later - earlier for earlier, later in zip(idle, idle[1:], strict=False)]
        assert 5 <= len(idle) <= 9 and gaps[0] < gaps[-1], gaps  # without the back-off: about 70
        file_id = upload(client, jsonl([chat_line("r0")]))
        made = time.monotonic()
        batch_id = create(client, file_id).json()["id"]
        assert wait_for(client, batch_id)["status"] == "completed"
        assert min(look for look in looks if look > made) - made < 0.5  # woken: the next look was a second away
