"""The Batch API on the real engine, through the OpenAI SDK (tests/integration/test_openai_sdk.py has a batch run
to its end): a batch cancelled mid-run; a server stopped mid-run and started again on the same store, which goes
on from the lines not yet answered and answers none twice; two API keys that cannot see each other's batches."""

import json
import time

import openai
import pytest
from openai import OpenAI

from tests.integration.server import Server, start_server

pytestmark = pytest.mark.engine

KEYS = "key-a,key-b"


def requests_file(client: OpenAI, count: int, max_tokens: int = 48) -> str:
    content = "\n".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "choir-tiny", "messages": [{"role": "user", "content": f"Story {i}"}],
                 "max_tokens": max_tokens, "ignore_eos": True}}) for i in range(count)).encode()
    return client.files.create(file=("requests.jsonl", content), purpose="batch").id


def start(directory, name: str) -> Server:
    return start_server(directory / f"{name}.log", {"CHOIR_API_KEY": KEYS, "CHOIR_BATCH_CONCURRENCY": "2",
                                                    "CHOIR_STORE_URL": f"sqlite+aiosqlite:///{directory / 'store.db'}"})


def client_of(server: Server, key: str = "key-a") -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)


def wait(client: OpenAI, batch_id: str, statuses=("completed", "failed", "cancelled", "expired"), timeout=240):
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    return batch


def answered_requests(server: Server) -> int:
    return sum(1 for line in server.log().splitlines() if line.startswith("{") and '"event": "request"' in line
               and '"path": "/v1/chat/completions"' in line and '"status": 200' in line)


def test_cancel_a_restart_and_other_keys(tmp_path):
    server = start(tmp_path, "first")
    try:
        a, b = client_of(server), client_of(server, "key-b")
        # Cancelled mid-run: it stops sending lines and ends with the answers it has.
        cancelled = a.batches.create(input_file_id=requests_file(a, 60, max_tokens=96),
                                     endpoint="/v1/chat/completions", completion_window="24h")
        wait(a, cancelled.id, ("in_progress",))
        assert a.batches.cancel(cancelled.id).status == "cancelling"
        cancelled = wait(a, cancelled.id)
        assert cancelled.status == "cancelled" and cancelled.request_counts.completed < 60
        # Another key sees none of it.
        with pytest.raises(openai.NotFoundError):
            b.batches.retrieve(cancelled.id)
        assert [batch.id for batch in b.batches.list()] == []
        # Stopped mid-run.
        resumed = a.batches.create(input_file_id=requests_file(a, 24), endpoint="/v1/chat/completions",
                                   completion_window="24h")
        wait(a, resumed.id, ("in_progress",))
        deadline = time.monotonic() + 60
        while answered_requests(server) < 3 + cancelled.request_counts.completed:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        server.stop()
    before = answered_requests(server) - cancelled.request_counts.completed
    assert 0 < before < 24
    again = start(tmp_path, "again")
    try:
        done = wait(client_of(again), resumed.id)
        assert done.status == "completed" and done.request_counts.completed == 24
        outputs = [json.loads(text) for text in client_of(again).files.content(done.output_file_id).text.splitlines()]
        assert [output["custom_id"] for output in outputs] == [f"r{i}" for i in range(24)]
        assert answered_requests(again) == 24 - before  # the lines not yet answered, each once
    finally:
        again.stop()
