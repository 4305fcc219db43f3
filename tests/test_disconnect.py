"""A client that leaves a non-streamed request: every engine request behind it is aborted at once
(as vLLM's `with_cancellation`), and the server goes on serving."""

import asyncio
import gc
import json

import pytest
from litestar.testing import AsyncTestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from choir.plugins.metrics import REQUEST_DISCONNECTS
from tests.fakes import FakeEngine, fake_engine_factory

MESSAGES = [{"role": "user", "content": "hi"}]
SLOW = ["tok"] * 2000  # 20 s at the delay below: far longer than the test


def http_scope(path: str) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "server": ("t", 80),
            "client": ("c", 1), "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"gone")]}


async def leave_after(app, engine: FakeEngine, path: str, body: dict, running: int) -> list[dict]:
    """Send `body`, then disconnect once `running` engine requests are under way; what the app sent back."""
    sent: list[dict] = []
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        while len(engine.running) < running:
            await asyncio.sleep(0.005)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await asyncio.wait_for(app(http_scope(path), receive, send), 10)
    return sent


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "x", "n": 4, "max_tokens": 200}),
    ("/v1/chat/completions", {"messages": MESSAGES, "n": 4, "max_tokens": 200}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 200}),
])
async def test_leaving_a_whole_request_aborts_every_engine_request(path, body):
    engine = FakeEngine(script=lambda prompt, params: SLOW, delay=0.01, max_model_len=4000)
    app = create_app(Settings(served_model_name="fake-model"), engine_factory=fake_engine_factory(engine))
    before = REQUEST_DISCONNECTS._value.get()
    async with AsyncTestClient(app) as client:
        choices = body.get("n", 1)
        await leave_after(app, engine, path, body, running=choices)
        assert engine.running == set() and len(engine.aborted) == choices
        assert REQUEST_DISCONNECTS._value.get() == before + 1
        # The server goes on serving.
        engine.script = lambda prompt, params: ["ok"]
        assert (await client.post(path, json={**body, "n": 1} if "n" in body else body)).status_code == 200


async def test_a_client_that_leaves_is_logged_and_counted_as_a_disconnect_not_a_500():
    from structlog.testing import capture_logs

    from choir.plugins.metrics import REQUESTS

    engine = FakeEngine(script=lambda prompt, params: SLOW, delay=0.01, max_model_len=4000)
    app = create_app(Settings(served_model_name="fake-model"), engine_factory=fake_engine_factory(engine))
    counted = REQUESTS.labels("createChatCompletion", "POST", "499")
    before, errors_before = counted._value.get(), REQUESTS.labels("createChatCompletion", "POST", "500")._value.get()
    async with AsyncTestClient(app):
        with capture_logs() as logs:
            await leave_after(app, engine, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 200}, 1)
    [line] = [entry for entry in logs if entry["event"] == "request"]
    assert line["status"] == 499 and line["client_left"] is True and line["request_id"] == "chatcmpl-gone"
    assert not [entry for entry in logs if entry["log_level"] == "error"], logs
    assert counted._value.get() == before + 1
    assert REQUESTS.labels("createChatCompletion", "POST", "500")._value.get() == errors_before
    assert engine.running == set() and len(engine.aborted) == 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
async def test_a_client_that_leaves_before_its_body_is_read_is_a_disconnect_not_a_500(path):
    from structlog.testing import capture_logs

    app = create_app(Settings(served_model_name="fake-model"), engine_factory=fake_engine_factory(FakeEngine()))
    events = iter([{"type": "http.request", "body": b'{"model": "fake-model", "mess', "more_body": True},
                   {"type": "http.disconnect"}])
    sent: list[dict] = []

    async def receive() -> dict:
        return next(events, {"type": "http.disconnect"})

    async def send(message: dict) -> None:
        sent.append(message)

    async with AsyncTestClient(app):
        with capture_logs() as logs:
            await asyncio.wait_for(app(http_scope(path), receive, send), 10)
    [line] = [entry for entry in logs if entry["event"] == "request"]
    assert line["status"] == 499 and line["client_left"] is True
    assert not [entry for entry in logs if entry["log_level"] == "error"], logs


async def serve_to_a_client_that_stays(app, path: str, body: dict) -> list[dict]:
    """One request as uvicorn serves it: the body, then `http.disconnect` only once the response is complete."""
    sent: list[dict] = []
    body_sent, done = False, asyncio.Event()

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await asyncio.wait_for(app(http_scope(path), receive, send), 10)
    return sent


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 4}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 4, "stream": True}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "n": 4}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "n": 4, "stream": True}),
    ("/v1/messages", {"model": "fake-model", "messages": MESSAGES, "max_tokens": 4}),
    ("/v1/messages", {"model": "fake-model", "messages": MESSAGES, "max_tokens": 4, "stream": True}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "store": False}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "store": False, "stream": True}),
])
async def test_a_served_request_leaves_nothing_for_the_cycle_collector(path, body):
    """The disconnect watch is stopped at every request's end; a watch that ended cancelled held its request's
    objects in a reference cycle (its task's CancelledError → traceback → frame → watch → task), which only the
    garbage collector freed: ~37 objects a request, ~0.06 ms of collection each on the bundled model."""
    engine = FakeEngine(script=lambda prompt, params: ["a", "b", "c", "d"], delay=0.001)
    app = create_app(Settings(served_model_name="fake-model"), engine_factory=fake_engine_factory(engine))
    async with AsyncTestClient(app):
        for _ in range(3):  # first-use caches
            await serve_to_a_client_that_stays(app, path, body)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(5):
                sent = await serve_to_a_client_that_stays(app, path, body)
                assert sent[0]["status"] == 200
            gc.collect()
            left = sorted({type(thing).__qualname__ for thing in gc.garbage})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert left == []
