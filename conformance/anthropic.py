"""Choir's and vLLM's Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) side by side.

Starts Choir and then vLLM's own OpenAI server (which serves /v1/messages too) on the bundled model with the same
engine flags (benchmarks.frontends.engine_flags), the qwen3 reasoning parser, the hermes tool parser and an API key,
sends each the same requests (greedy, few tokens) and prints one Markdown table of what came back: the status, an
error's JSON shape and `error.type`, and for a 200 the content block types, stop_reason, stop_sequence, usage, the
message and tool_use id prefixes and the `request-id`/`x-request-id` headers; for a stream also the event names (runs
collapsed), whether `ping` comes and whether every event has an `event:` line. The section "Choir and vLLM's
/v1/messages side by side" of docs/api/messages.md is built from its output.

    .venv/bin/python -m conformance.anthropic [--out FILE]
"""

import itertools
import json
import re
from pathlib import Path

import httpx

from benchmarks.frontends import engine_flags
from conformance import side_by_side
from tests.integration.server import Server, start_server, start_vllm_server

KEY = "k"
MODEL = "choir-tiny"
HI = [{"role": "user", "content": "Hello"}]
BASE = {"model": MODEL, "max_tokens": 16, "temperature": 0, "thinking": {"type": "disabled"}, "messages": HI}
WEATHER = {"name": "get_weather", "description": "Weather for a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
    "additionalProperties": False}}
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
BEARER = {"authorization": f"Bearer {KEY}"}
SHORT = {"message_start": "msg_start", "content_block_start": "cb_start", "content_block_delta": "cb_delta",
         "content_block_stop": "cb_stop", "message_delta": "msg_delta", "message_stop": "msg_stop"}


def body(**changes) -> dict:
    return {k: v for k, v in {**BASE, **changes}.items() if v is not None}


def tool_round_trip() -> list[dict]:
    calls = [{"type": "tool_use", "id": f"toolu_0{i}", "name": "get_weather", "input": {"city": city}}
             for i, city in ((1, "Paris"), (2, "Atlantis"))]
    results = [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny, 21C"},
               {"type": "tool_result", "tool_use_id": "toolu_02", "content": [{"type": "text", "text": "no city"}],
                "is_error": True}, {"type": "text", "text": "Thanks, and now?"}]
    return [{"role": "user", "content": "Weather in Paris and Atlantis?"}, {"role": "assistant", "content": calls},
            {"role": "user", "content": results}]


# (name, what is asked, path, body (a str: sent as is), extra headers (None: no auth header))
CASES: list[tuple[str, str, str, dict | str, dict | None]] = [
    ("hello", "user Hello, max_tokens 16, thinking disabled", "/v1/messages", body(), BEARER),
    ("hello-stream", "the same, stream", "/v1/messages", body(stream=True), BEARER),
    ("system-blocks", "system as 2 blocks, the first Claude Code's billing header", "/v1/messages", body(system=[
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=x;"},
        {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]), BEARER),
    ("stop-space", 'stop_sequences [" "]', "/v1/messages", body(stop_sequences=[" "]), BEARER),
    ("max-tokens-100k", "max_tokens 100000 (context 2048)", "/v1/messages", body(max_tokens=100000), BEARER),
    ("prompt-too-long", '"word " * 3000', "/v1/messages", body(messages=[{"role": "user", "content": "word " * 3000}]),
     BEARER),
    ("tool-forced", "tool_choice tool get_weather (city maxLength 12), max_tokens 64", "/v1/messages",
     body(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=64), BEARER),
    ("tool-forced-stream", "the same, stream", "/v1/messages",
     body(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=64, stream=True), BEARER),
    ("tool-forced-cut", "the same, max_tokens 8 (cut inside the call)", "/v1/messages",
     body(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=8), BEARER),
    ("tool-any", "tool_choice any, max_tokens 64", "/v1/messages",
     body(tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=64), BEARER),
    ("tool-auto", "tools, tool_choice left out (auto), max_tokens 64", "/v1/messages",
     body(tools=[WEATHER], max_tokens=64), BEARER),
    ("tool-round-trip", "tool_use ×2, tool_result ×2 (one is_error) + text", "/v1/messages",
     body(tools=[WEATHER], messages=tool_round_trip()), BEARER),
    ("thinking", "thinking enabled budget_tokens 8, max_tokens 30", "/v1/messages",
     body(max_tokens=30, thinking={"type": "enabled", "budget_tokens": 8}), BEARER),
    ("thinking-stream", "the same, stream", "/v1/messages",
     body(max_tokens=30, thinking={"type": "enabled", "budget_tokens": 8}, stream=True), BEARER),
    ("thinking-1024-stream", "thinking budget_tokens 1024 (vLLM's least), max_tokens 1030, stream", "/v1/messages",
     body(max_tokens=1030, thinking={"type": "enabled", "budget_tokens": 1024}, stream=True), BEARER),
    ("prefill", 'final assistant turn "The answer is"', "/v1/messages",
     body(messages=[*HI, {"role": "assistant", "content": "The answer is"}]), BEARER),
    ("inline-system", 'role "system" inside messages', "/v1/messages",
     body(messages=[*HI, {"role": "assistant", "content": "Hi!"}, {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Again"}]), BEARER),
    ("role-ctx", 'unknown role "ctx"', "/v1/messages",
     body(messages=[{"role": "ctx", "content": "context"}, *HI]), BEARER),
    ("image", "image block (base64 png)", "/v1/messages", body(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "text", "text": "What is this?"}]}]), BEARER),
    ("document", "document block (text source)", "/v1/messages", body(messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "A short note."}},
        {"type": "text", "text": "Summarise."}]}]), BEARER),
    ("web-search", "server tool web_search_20250305", "/v1/messages",
     body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), BEARER),
    ("mcp-servers", "mcp_servers [url server]", "/v1/messages",
     body(mcp_servers=[{"type": "url", "url": "https://example.com/sse", "name": "example"}]), BEARER),
    ("unknown-model", 'model "claude-sonnet-4-5"', "/v1/messages", body(model="claude-sonnet-4-5"), BEARER),
    ("no-max-tokens", "max_tokens left out", "/v1/messages", {k: v for k, v in BASE.items() if k != "max_tokens"},
     BEARER),
    ("temperature-1.5", "temperature 1.5 (Anthropic: 0-1)", "/v1/messages", body(temperature=1.5), BEARER),
    ("invalid-json", 'body `{"model": `', "/v1/messages", '{"model": ', BEARER),
    ("auth-x-api-key", "x-api-key: k (no Authorization)", "/v1/messages", body(), {"x-api-key": KEY}),
    ("auth-bearer", "Authorization: Bearer k", "/v1/messages", body(), BEARER),
    ("auth-wrong", "x-api-key and Bearer both wrong", "/v1/messages", body(),
     {"x-api-key": "wrong", "authorization": "Bearer wrong"}),
    ("count-tokens", "count_tokens of hello's body (no max_tokens)", "/v1/messages/count_tokens",
     {k: v for k, v in BASE.items() if k not in ("max_tokens", "temperature")}, BEARER),
    ("beta-query", "?beta=true, anthropic-version 2023-06-01, anthropic-beta with an unknown beta",
     "/v1/messages?beta=true", body(), {**BEARER, "anthropic-version": "2023-06-01",
                                        "anthropic-beta": "claude-code-20250219,unknown-beta-1"}),
]


def start_vllm(log: Path) -> Server:
    return start_vllm_server(log, [*engine_flags(), "--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
                                   "--tool-call-parser", "hermes", "--api-key", KEY])


def start_choir(log: Path) -> Server:
    return start_server(log, env={"VLLM_CPU_KVCACHE_SPACE": "1", "CHOIR_REASONING_PARSER": "qwen3",
                                  "CHOIR_TOOL_PARSER": "hermes", "CHOIR_STORE": "off", "CHOIR_LOG_LEVEL": "warning",
                                  "CHOIR_API_KEY": KEY})


def shape(value) -> str:
    """A JSON value's keys, nested: {error:{message,type},type}."""
    if isinstance(value, dict):
        return "{" + ",".join(k + (":" + shape(v) if isinstance(v, dict) else "") for k, v in value.items()) + "}"
    return type(value).__name__


def prefix(value) -> str:
    """An id's kind: its prefix (`msg_`, `chatcmpl-tool-`), else `hex` and its length."""
    match = re.match(r"[A-Za-z]+[_-](?:tool[_-])?", value) if isinstance(value, str) else None
    if match:
        return f"`{match.group(0)}`"
    return f"hex ({len(value)})" if isinstance(value, str) and re.fullmatch(r"[0-9a-f]+", value) else repr(value)


def quoted(text: str, width: int = 40) -> str:
    text = text if len(text) <= width else text[:width] + "…"
    return "`" + json.dumps(text, ensure_ascii=False)[1:-1].replace("|", "\\|").replace("`", "'") + "`"


def usage(values: dict) -> str:
    return ", ".join(f"{k} {v}" if not isinstance(v, dict) else k for k, v in values.items())


def describe_blocks(blocks: list[dict], texts: dict[str, str], inputs: list[str], facts: list[str]) -> None:
    facts.append("blocks [" + ", ".join(block["type"] for block in blocks) + "]")
    if texts.get("text"):
        facts.append("text " + quoted(texts["text"]))
    if "thinking" in texts:
        facts.append(f"thinking {len(texts['thinking'])} chars")
    for block in blocks:
        if block["type"] == "tool_use":
            facts.append(f"tool id {prefix(block.get('id'))}")
    facts.extend("input " + quoted(text, 60) for text in inputs)


def observe(response: httpx.Response) -> tuple[str, dict]:
    """What a reply shows, as one table cell, and its JSON (for count_tokens' comparison)."""
    facts = [f"**{response.status_code}**"]
    data: dict = {}
    if "text/event-stream" in response.headers.get("content-type", ""):
        facts += describe_stream(response.text)
    else:
        try:
            data = response.json()
        except ValueError:
            facts.append("body " + quoted(response.text))
        else:
            if response.status_code != 200:
                error = data.get("error") if isinstance(data.get("error"), dict) else {}
                facts += [f"shape `{shape(data)}`", f"error.type `{error.get('type')}`",
                          "message " + quoted(str(error.get("message") or data), 150)]
            elif "input_tokens" in data:
                facts.append(f"input_tokens {data['input_tokens']}, shape `{shape(data)}`")
            else:
                blocks = data.get("content", [])
                texts = {kind: "".join(b.get(kind, "") for b in blocks if b["type"] == kind)
                         for kind in ("text", "thinking") if any(b["type"] == kind for b in blocks)}
                inputs = [json.dumps(b["input"]) for b in blocks if b["type"] == "tool_use"]
                describe_blocks(blocks, texts, inputs, facts)
                signatures = [b.get("signature", "") for b in blocks if b["type"] == "thinking"]
                facts += [f"signature {signature_kind(s)}" for s in signatures]
                facts += [f"stop_reason `{data.get('stop_reason')}`, stop_sequence {data.get('stop_sequence')!r}",
                          f"usage {usage(data.get('usage', {}))}", f"id {prefix(data.get('id'))}"]
    headers = [f"{name} {prefix(response.headers[name])}" for name in ("request-id", "x-request-id")
               if name in response.headers]
    facts.append("headers: " + (", ".join(headers) or "neither"))
    return "<br>".join(facts), data


def signature_kind(signature: str) -> str:
    kind = "hex" if re.fullmatch(r"[0-9a-f]+", signature) else "other"
    return f"{len(signature)} chars, {kind}" + (f" {quoted(signature, 12)}" if signature else "")


def describe_stream(text: str) -> list[str]:
    names, unnamed, blocks, deltas, texts, inputs, signatures, stop, use = [], 0, [], [], {}, [], [], {}, {}
    first_id = None
    for chunk in filter(None, (c.strip() for c in text.split("\n\n"))):
        lines = chunk.splitlines()
        name = next((line[6:].strip() for line in lines if line.startswith("event:")), None)
        payload = "".join(line[5:].strip() for line in lines if line.startswith("data:"))
        event = json.loads(payload) if payload.startswith("{") else {}
        unnamed += name is None
        names.append(name or event.get("type", "?"))
        if event.get("type") == "message_start":
            use, first_id = event["message"].get("usage", {}), event["message"].get("id")
        elif event.get("type") == "content_block_start":
            blocks.append(event["content_block"])
        elif event.get("type") == "content_block_delta":
            delta = event["delta"]
            if delta["type"] not in deltas:
                deltas.append(delta["type"])
            if delta["type"] in ("text_delta", "thinking_delta"):
                kind = delta["type"][:-6]
                texts[kind] = texts.get(kind, "") + delta[kind]
            elif delta["type"] == "input_json_delta":
                inputs[-1:] = [(inputs[-1] if inputs else "") + delta["partial_json"]]
            elif delta["type"] == "signature_delta":
                signatures.append(delta["signature"])
        elif event.get("type") == "message_delta":
            stop, use = event.get("delta", {}), {**use, **event.get("usage", {})}
        elif event.get("type") == "error":
            names[-1] = f"error({event.get('error', {}).get('type')})"
    runs = " ".join(SHORT.get(k, k) + (f"×{n}" if (n := len(list(g))) > 1 else "")
                    for k, g in itertools.groupby(names))
    facts = [f"events: {runs}", f"ping {'yes' if 'ping' in names else 'no'}; every event named: "
                                f"{'yes' if not unnamed else f'no ({unnamed} without)'}"]
    describe_blocks(blocks, texts, inputs, facts)
    facts.append("deltas " + (", ".join(deltas) or "none"))
    facts += [f"signature_delta {signature_kind(s)}" for s in signatures]
    facts += [f"stop_reason `{stop.get('stop_reason')}`, stop_sequence {stop.get('stop_sequence')!r}",
              f"usage (start+delta) {usage(use)}", f"id {prefix(first_id)}"]
    return facts


def run_cases(server: Server) -> dict[str, tuple[str, dict]]:
    results = {}
    with httpx.Client(base_url=server.base_url, timeout=180) as client:
        for name, _, path, payload, headers in CASES:
            raw = payload if isinstance(payload, str) else json.dumps(payload)
            response = client.post(path, content=raw, headers={"content-type": "application/json", **headers})
            results[name] = observe(response)
    counted = results["count-tokens"]
    hello = results["hello"][1].get("usage", {})
    total = hello.get("input_tokens", 0) + (hello.get("cache_read_input_tokens") or 0)
    results["count-tokens"] = (counted[0] + f"<br>hello's usage: input+cache_read = {total}", counted[1])
    return results


def main() -> None:
    out = side_by_side.out_path(__doc__.splitlines()[0])
    results, seconds = side_by_side.compare("anthropic", start_choir, start_vllm, run_cases)
    lines = side_by_side.table(CASES, results, cell=lambda result: result[0])
    lines += ["", "Every request: model choir-tiny, temperature 0, max_tokens 16, thinking disabled, "
              "`Authorization: Bearer k`, unless the row says otherwise. Events: " + ", ".join(
                  f"{short} = {long}" for long, short in SHORT.items()) + "; ×n: n in a row.",
              f"Both on the bundled model with `{' '.join(engine_flags()[2:])}`; "
              f"{seconds:.0f} s in all."]
    side_by_side.publish(lines, out)


if __name__ == "__main__":
    main()
