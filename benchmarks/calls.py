"""Python function calls per request: Choir's own work, counted, not timed.

On shared cores CPU time per request swings by tens of percent between runs of the same code
(`benchmarks.overhead`), and this machine has no hardware counters. The number of Python calls a
request makes is the same in every run, so it tells two versions of a change apart where timings
cannot. The app runs in this thread (ASGI called directly, no sockets) over the scripted engine of
`benchmarks.overhead`, whose own calls are included and the same for every version.

    python -m benchmarks.calls [--requests 50]
"""

import argparse
import asyncio
import json
import sys
from typing import Any

from benchmarks.overhead import create_null_app

SCENARIOS = {
    "chat whole": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}),
    "chat stream": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
                                             "stream": True}),
    "chat n=4 stream": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
                                                 "n": 4, "stream": True}),
    "chat n=4 whole": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
                                                "n": 4}),
    "completions whole": ("/v1/completions", {"prompt": "hi", "max_tokens": 16}),
    "completions stream": ("/v1/completions", {"prompt": "hi", "max_tokens": 16, "stream": True}),
    "completions n=4 stream": ("/v1/completions", {"prompt": "hi", "max_tokens": 16, "n": 4, "stream": True}),
    "messages whole": ("/v1/messages", {"model": "choir-tiny", "messages": [{"role": "user", "content": "hi"}],
                                        "max_tokens": 16}),
    "messages stream": ("/v1/messages", {"model": "choir-tiny", "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 16, "stream": True}),
    # a 4 × 4 PNG: the image checks' own calls (the scripted engine does not decode it)
    "chat image whole": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": (
            "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAADElEQVR4nGNgIB0AAAA0AAF2Xq7D"
            "AAAAAElFTkSuQmCC")}}]}], "max_tokens": 16}),
}


def _scope(path: str) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "server": ("b", 80),
            "client": ("c", 1), "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"calls")]}


async def _request(app: Any, path: str, body: dict[str, Any]) -> None:
    payload, sent, done = json.dumps(body).encode(), False, asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await done.wait()  # as a server does: the disconnect comes once the response is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(_scope(path), receive, send)


async def count(requests: int) -> dict[str, int]:
    from litestar.testing import AsyncTestClient

    app = create_null_app()
    calls = 0

    def counter(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    results = {}
    async with AsyncTestClient(app):  # runs the lifespan: the scripted engine starts
        for name, (path, body) in SCENARIOS.items():
            for _ in range(10):  # warm: first-use imports and caches
                await _request(app, path, body)
            calls = 0
            sys.setprofile(counter)
            for _ in range(requests):
                await _request(app, path, body)
            sys.setprofile(None)
            results[name] = round(calls / requests)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    for name, calls in asyncio.run(count(args.requests)).items():
        print(f"{name:<24} {calls:6d} calls/request")


if __name__ == "__main__":
    main()
