"""Read an SSE body the way a client does: a list of `data:` payloads."""

import json


def sse_payloads(body: str) -> list[str]:
    return [line[len("data: "):] for line in body.replace("\r\n", "\n").split("\n") if line.startswith("data: ")]


def sse_json(body: str) -> tuple[list[dict], int]:
    """The JSON events, and how many `[DONE]` events came (which must be last)."""
    payloads = sse_payloads(body)
    done = payloads.count("[DONE]")
    assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
    return [json.loads(p) for p in payloads if p != "[DONE]"], done
