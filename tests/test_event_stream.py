"""EventStream at the ASGI level: what each write carries, a client that leaves, a stream that fails."""

import asyncio

import pytest

from choir.app.routes.event_stream import EventStream, Keepalive
from choir.app.serving.streaming import Final
from choir.plugins.metrics import STREAM_DISCONNECTS


class Client:
    """An ASGI server's side of one response: records each send; `leave()` disconnects."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.gone = asyncio.Event()

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.gone.set()

    @property
    def bodies(self) -> list[tuple[bytes, bool]]:
        return [(m["body"], m["more_body"]) for m in self.sent if m["type"] == "http.response.body"]


async def respond(stream: EventStream, client: Client) -> None:
    asgi = stream.to_asgi_response(None, None)
    await asgi({"type": "http"}, client.receive, client.send)


def event_stream(frames, first: bytes = b"data: 1\n\n") -> EventStream:
    return EventStream(first, frames, last=b"data: [DONE]\n\n", error_frame=lambda exc: f"error: {exc}\n\n".encode(),
                       headers={"x-request-id": "r"})


async def test_the_final_frames_go_out_with_the_end_of_the_response():
    async def frames():
        yield b"data: 2\n\n"
        yield Final(b"data: 3\n\ndata: usage\n\n")

    client = Client()
    await respond(event_stream(frames()), client)
    start = client.sent[0]
    assert start["status"] == 200 and (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert not any(name == b"content-length" for name, _ in start["headers"])
    assert client.bodies == [(b"data: 1\n\n", True), (b"data: 2\n\n", True),
                             (b"data: 3\n\ndata: usage\n\ndata: [DONE]\n\n", False)]


async def test_a_stream_without_a_final_frame_still_ends_with_last():
    async def frames():
        yield b"data: 2\n\n"

    client = Client()
    await respond(event_stream(frames()), client)
    assert client.bodies[-1] == (b"data: [DONE]\n\n", False)


async def test_a_failure_after_the_start_is_the_error_frame_then_last():
    async def frames():
        yield b"data: 2\n\n"
        raise ValueError("broke")

    client = Client()
    await respond(event_stream(frames()), client)
    assert client.bodies[-2:] == [(b"data: 2\n\n", True), (b"error: broke\n\ndata: [DONE]\n\n", False)]


async def test_a_client_that_leaves_closes_the_frames_at_once_and_the_response_ends_quietly():
    closed = asyncio.Event()

    async def frames():
        try:
            await asyncio.sleep(3600)  # waiting on the engine
            yield b"never"
        finally:
            closed.set()

    client = Client()
    before = STREAM_DISCONNECTS._value.get()
    response = asyncio.create_task(respond(event_stream(frames()), client))
    await asyncio.sleep(0.01)
    client.leave()
    await asyncio.wait_for(response, 1)  # returns normally: no error reaches the server
    assert closed.is_set() and STREAM_DISCONNECTS._value.get() == before + 1
    assert all(more for _, more in client.bodies)  # nothing more was sent


async def test_a_cancel_from_outside_is_not_swallowed():
    async def frames():
        await asyncio.sleep(3600)
        yield b"never"

    client = Client()
    response = asyncio.create_task(respond(event_stream(frames()), client))
    await asyncio.sleep(0.01)
    response.cancel()
    with pytest.raises(asyncio.CancelledError):
        await response


async def test_the_completed_response_is_not_taken_for_a_disconnect():
    """uvicorn's receive() says http.disconnect once the response is complete: that must not cancel anything."""
    class Server(Client):
        async def send(self, message: dict) -> None:
            await super().send(message)
            if message.get("more_body") is False:
                self.leave()

    async def frames():
        yield Final(b"data: 2\n\n")

    client = Server()
    before = STREAM_DISCONNECTS._value.get()
    await respond(event_stream(frames()), client)
    await asyncio.sleep(0.01)
    assert client.bodies[-1] == (b"data: 2\n\ndata: [DONE]\n\n", False)
    assert STREAM_DISCONNECTS._value.get() == before


async def test_a_keepalive_fills_each_silence_and_stops_with_the_stream():
    async def frames():
        await asyncio.sleep(0.25)  # silent: keepalives
        yield b"data: 2\n\n"
        yield Final(b"data: 3\n\n")

    stream = EventStream(b"data: 1\n\n", frames(), last=b"", error_frame=lambda exc: b"", headers={},
                         keepalive=Keepalive(b": ping\n\n", 0.1))
    client = Client()
    await respond(stream, client)
    bodies = [body for body, _ in client.bodies]
    assert bodies[0] == b"data: 1\n\n" and bodies[-2:] == [b"data: 2\n\n", b"data: 3\n\n"]
    assert set(bodies[1:-2]) == {b": ping\n\n"} and 1 <= len(bodies[1:-2]) <= 3
    await asyncio.sleep(0.25)
    assert len(client.bodies) == len(bodies)  # nothing after the end


async def test_no_keepalive_while_frames_flow():
    async def frames():
        for _ in range(10):
            await asyncio.sleep(0.02)
            yield b"data: x\n\n"

    stream = EventStream(b"data: 1\n\n", frames(), last=b"", error_frame=lambda exc: b"", headers={},
                         keepalive=Keepalive(b": ping\n\n", 0.1))
    client = Client()
    await respond(stream, client)
    assert b": ping\n\n" not in [body for body, _ in client.bodies]


async def test_a_slow_reader_is_not_silence_and_gets_no_keepalive_mid_send():
    """A send that blocks (a client reading slowly) for longer than the period: no keepalive is written
    under it, and the timer does not spin."""
    looks = 0

    class SlowClient(Client):
        async def send(self, message: dict) -> None:
            if message.get("body") == b"data: 2\n\n":
                await asyncio.sleep(0.35)
            await super().send(message)

    async def frames():
        yield b"data: 2\n\n"
        yield Final(b"data: 3\n\n")

    stream = EventStream(b"data: 1\n\n", frames(), last=b"", error_frame=lambda exc: b"", headers={},
                         keepalive=Keepalive(b": ping\n\n", 0.1))
    loop = asyncio.get_running_loop()
    original = loop.call_later

    def counted(delay, callback, *args, **kwargs):
        nonlocal looks
        looks += 1
        return original(delay, callback, *args, **kwargs)

    loop.call_later = counted
    try:
        client = SlowClient()
        await respond(stream, client)
    finally:
        del loop.call_later
    assert [body for body, _ in client.bodies] == [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]
    assert looks < 20
