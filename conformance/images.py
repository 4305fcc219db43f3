"""Choir's and vLLM's image input side by side: chat, /tokenize and /v1/responses with images.

Starts Choir and then vLLM's own OpenAI server (one at a time: two CPU engines) on the bundled tiny vision-language
model (models/choir-tiny-vlm: a LLaVA giving each image 16 tokens) with the same engine flags (Choir's, with
`--limit-mm-per-prompt.image 2`), sends each the same requests (greedy, few tokens) and prints one Markdown table of
what came back: the status; for a 200 `usage.prompt_tokens`, finish_reason and the text's start (a stream: its chunks
and whether it ends with [DONE]; /tokenize: the count); for an error its `param`, `type` and message. Neither server
trusts per-request mm kwargs, and Choir fetches no image URLs (its defaults).

    .venv/bin/python -m conformance.images [--out FILE]
"""

import base64
import io
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from choir.core.settings import BUNDLED_VLM_DIR, Settings
from conformance import side_by_side
from tests.integration.server import Server, start_server, start_vllm_server

MODEL = "choir-tiny-vlm"
ENGINE_ARGS = ("--limit-mm-per-prompt.image", "2")
MAX_BODY = 16 * 1024 * 1024  # Choir's CHOIR_MAX_BODY_BYTES default
TIMEOUT = 120
ASK = "What is in the picture?"


def encode(color: tuple[int, int, int], size: tuple[int, int] = (32, 24), kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, kind)
    return out.getvalue()


def data_url(raw: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


def damaged(raw: bytes) -> bytes:
    return raw[:-20] + bytes(20)


def truncated_jpeg() -> bytes:
    """Its header whole, its scan cut: only decoding finds it out."""
    out = io.BytesIO()
    Image.frombytes("RGB", (256, 256), random.Random(5).randbytes(256 * 256 * 3)).save(out, "JPEG")
    return out.getvalue()[: out.tell() * 4 // 5]


# Each case its own colour: vLLM's processor cache (in both servers) keys images by their bytes.
RED, BLUE = data_url(encode((220, 30, 30))), data_url(encode((20, 40, 230)))
BIG = encode((90, 160, 40), (6000, 6000))  # 36 MP: under Choir's 40 MP default
HUGE = encode((40, 90, 160), (9000, 9000))  # 81 MP: over it (and under PIL's own bomb limit, 89 MP)
assert len(data_url(HUGE)) < MAX_BODY and len(data_url(BIG)) < MAX_BODY, "the large images must fit Choir's body"
ORPHAN = data_url(encode((128, 128, 128)))  # rendered for a request over the context, then sent in a normal one
TIPPED = data_url(encode((30, 200, 60)))  # the same, where only the image puts the prompt over the context
FITS = 1015  # "word " * 1015: 2039 tokens, the image's 16 make 2055 (context 2048)


def part(url: Any, **extra: Any) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra} if not isinstance(url, dict) else url}


def ask(*parts: dict, text: str = ASK) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]


def chat(*parts: dict, text: str = ASK, **changes: Any) -> dict:
    return {"model": MODEL, "messages": ask(*parts, text=text), "max_tokens": 6, "temperature": 0, **changes}


CHAT = "/v1/chat/completions"
Step = tuple[str, dict]  # (path, body)
# (name, what is asked, the requests (reported one after another), timed)
CASES: list[tuple[str, str, list[Step], bool]] = [
    ("png", "one PNG data URL (32×24) + text", [(CHAT, chat(part(RED)))], False),
    ("two-images", "two PNGs", [(CHAT, chat(part(RED), part(BLUE)))], False),
    ("three-images", "three PNGs (limit 2)", [(CHAT, chat(part(RED), part(BLUE), part(RED)))], False),
    ("detail-low", '`detail: "low"`', [(CHAT, chat(part(RED, detail="low")))], False),
    ("detail-bogus", '`detail: "ultra"` (not auto/low/high)', [(CHAT, chat(part(RED, detail="ultra")))], False),
    ("jpeg", "JPEG (image/jpeg)", [(CHAT, chat(part(data_url(encode((200, 200, 0), kind="JPEG"), "image/jpeg"))))],
     False),
    ("jpg-alias", "JPEG declared `image/jpg`",
     [(CHAT, chat(part(data_url(encode((200, 100, 0), kind="JPEG"), "image/jpg"))))], False),
    ("webp", "WebP", [(CHAT, chat(part(data_url(encode((0, 200, 200), kind="WEBP"), "image/webp"))))], False),
    ("gif", "GIF", [(CHAT, chat(part(data_url(encode((200, 0, 200), kind="GIF"), "image/gif"))))], False),
    ("bmp", "BMP declared `image/bmp`", [(CHAT, chat(part(data_url(encode((10, 10, 10), kind="BMP"), "image/bmp"))))],
     False),
    ("png-as-jpeg", "PNG bytes declared `image/jpeg`",
     [(CHAT, chat(part(data_url(encode((50, 60, 70)), "image/jpeg"))))], False),
    ("not-an-image", 'base64 of b"not an image" as image/png', [(CHAT, chat(part(data_url(b"not an image"))))],
     False),
    ("damaged", "PNG with its last 20 bytes zeroed", [(CHAT, chat(part(data_url(damaged(encode((1, 2, 3)))))))],
     False),
    ("bad-base64", "`data:image/png;base64,%%%`", [(CHAT, chat(part("data:image/png;base64,%%%")))], False),
    ("upper-base64", "a PNG as `data:image/png;BASE64,…` (RFC 2397: case-insensitive)",
     [(CHAT, chat(part(data_url(encode((7, 8, 9))).replace(";base64,", ";BASE64,"))))], False),
    ("truncated-jpeg", "a noisy 256×256 JPEG cut to 80 % of its bytes",
     [(CHAT, chat(part(data_url(truncated_jpeg(), "image/jpeg"))))], False),
    ("text-plain", "a real PNG as `data:text/plain;base64,…`",
     [(CHAT, chat(part(data_url(encode((4, 5, 6)), "text/plain"))))], False),
    ("http-url", "`http://127.0.0.1:9/cat.png` (nothing listens)", [(CHAT, chat(part("http://127.0.0.1:9/cat.png")))],
     False),
    ("file-url", "`file:///etc/passwd`", [(CHAT, chat(part("file:///etc/passwd")))], False),
    ("no-url", "`image_url: {}` (no url)", [(CHAT, chat(part({})))], False),
    ("url-string", "`image_url` a bare string, not {url}", [(CHAT, chat({"type": "image_url", "image_url": RED}))],
     False),
    ("36mp", f"6000×6000 PNG (36 MP, {len(BIG) // 1024} KiB)", [(CHAT, chat(part(data_url(BIG))))], True),
    ("81mp", f"9000×9000 PNG (81 MP, {len(HUGE) // 1024} KiB)", [(CHAT, chat(part(data_url(HUGE))))], True),
    ("stream", "two PNGs, stream, include_usage",
     [(CHAT, chat(part(RED), part(BLUE), stream=True, stream_options={"include_usage": True}))], False),
    ("n2-seed", "n 2, seed 7 (temperature 0)", [(CHAT, chat(part(RED), n=2, seed=7))], False),
    ("n2-seed-t1", "n 2, seed 7, temperature 1", [(CHAT, chat(part(RED), n=2, seed=7, temperature=1.0))], False),
    ("tokenize", "/tokenize, `messages` with one PNG (the count)",
     [("/tokenize", {"model": MODEL, "messages": ask(part(RED))})], False),
    ("tokenize-text", "/tokenize, the same text, no image", [("/tokenize", {"model": MODEL, "messages": ask()})],
     False),
    ("responses", "/v1/responses, `input_image` + `input_text`, store false", [("/v1/responses", {
        "model": MODEL, "max_output_tokens": 6, "temperature": 0, "store": False, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": ASK},
                                         {"type": "input_image", "image_url": RED, "detail": "auto"}]}]})], False),
    ("over-context", '(1) `"word " * 2100` + a new PNG (context 2048), (2) that PNG in a normal request, '
                     "(3) the same again", [(CHAT, chat(part(ORPHAN), text="word " * 2100)), (CHAT, chat(part(ORPHAN))),
                                            (CHAT, chat(part(ORPHAN)))], False),
    ("over-by-image", f'(1) `"word " * {FITS}` (2039 tokens) + a new PNG (16 more: over 2048), (2) that PNG in a '
                      "normal request, (3) the same again", [(CHAT, chat(part(TIPPED), text="word " * FITS)),
                                                             (CHAT, chat(part(TIPPED))), (CHAT, chat(part(TIPPED)))],
     False),
    ("mm-kwargs", '`mm_processor_kwargs: {"do_normalize": false}` (no trust flag)',
     [(CHAT, chat(part(RED), mm_processor_kwargs={"do_normalize": False}))], False),
    ("media-io-kwargs", '`media_io_kwargs: {"image": {"foo": 1}}` (no trust flag)',
     [(CHAT, chat(part(RED), media_io_kwargs={"image": {"foo": 1}}))], False),
    ("after", "one PNG again, after all the above", [(CHAT, chat(part(BLUE)))], False),
]


def settings() -> Settings:
    return Settings(model=str(BUNDLED_VLM_DIR), served_model_name=MODEL, engine_args=ENGINE_ARGS)


def engine_flags() -> list[str]:
    from vllm.platforms import current_platform

    from choir.engine.vllm.args import engine_argv

    return engine_argv(settings(), on_cpu=current_platform.is_cpu())


def start_vllm(log: Path) -> Server:
    return start_vllm_server(log, engine_flags())


def start_choir(log: Path) -> Server:
    return start_server(log, env={"CHOIR_MODEL": str(BUNDLED_VLM_DIR), "CHOIR_ENGINE_ARGS": " ".join(ENGINE_ARGS),
                                  "CHOIR_STORE": "off", "CHOIR_LOG_LEVEL": "warning", "VLLM_CPU_KVCACHE_SPACE": "1"})


def quoted(text: str, width: int = 20) -> str:
    text = text if len(text) <= width else text[:width] + "…"
    return "`" + json.dumps(text, ensure_ascii=False)[1:-1].replace("|", "\\|").replace("`", "'") + "`"


def error_facts(data: Any) -> list[str]:
    error = data.get("error") if isinstance(data, dict) else None
    error = error if isinstance(error, dict) else data if isinstance(data, dict) else {}
    facts = [f"param `{error['param']}`"] if error.get("param") else []
    message = error.get("message") if error.get("message") is not None else error.get("detail", data)
    return [*facts, f"type `{error.get('type')}`", "message " + quoted(str(message), 90)]


def describe_stream(text: str) -> list[str]:
    events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    content, finish, use, errors = "", None, None, []
    for event in events:
        if event == "[DONE]":
            continue
        chunk = json.loads(event)
        if "error" in chunk:
            errors += error_facts(chunk)
        for choice in chunk.get("choices") or []:
            content += (choice.get("delta") or {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
        use = chunk.get("usage") or use
    facts = [f"{len(events)} chunks, ends with [DONE]: {'yes' if events and events[-1] == '[DONE]' else 'no'}"]
    if use:
        facts.append(f"prompt_tokens {use.get('prompt_tokens')}")
    return [*facts, f"finish `{finish}`, text {quoted(content)}", *errors]


def describe(response: httpx.Response) -> list[str]:
    """One reply's facts."""
    facts = [f"**{response.status_code}**"]
    if "text/event-stream" in response.headers.get("content-type", ""):
        return facts + describe_stream(response.text)
    try:
        data = response.json()
    except ValueError:
        return facts + ["body " + quoted(response.text, 90)]
    if response.status_code != 200:
        return facts + error_facts(data)
    if "tokens" in data:
        return facts + [f"count {data.get('count', len(data['tokens']))}"]
    if data.get("object") == "response":
        text = "".join(c.get("text", "") for item in data.get("output", []) if item.get("type") == "message"
                       for c in item.get("content", []))
        return facts + [f"input_tokens {data.get('usage', {}).get('input_tokens')}, status `{data.get('status')}`",
                        f"text {quoted(text)}"]
    facts.append(f"prompt_tokens {data.get('usage', {}).get('prompt_tokens')}")
    return facts + [f"finish `{c.get('finish_reason')}`, text {quoted(c.get('message', {}).get('content') or '')}"
                    for c in data.get("choices", [])]


def run_cases(server: Server) -> dict[str, str]:
    """Each request on a connection of its own: a server that drops one after a 500 spoils no other case."""
    results = {}
    for name, _, steps, timed in CASES:
        cells = []
        for number, (path, payload) in enumerate(steps, 1):
            began = time.monotonic()
            try:
                facts = describe(httpx.post(server.base_url + path, json=payload, timeout=TIMEOUT))
            except httpx.HTTPError as exc:
                facts = [f"**no answer** ({type(exc).__name__})"]
            if timed:
                facts.append(f"{time.monotonic() - began:.1f} s")
            cells.append((f"({number}) " if len(steps) > 1 else "") + "<br>".join(facts))
        results[name] = "<br>".join(cells)
    results["after"] += f"<br>/health {httpx.get(f'{server.base_url}/health', timeout=10).status_code}"
    return results


def main() -> None:
    out = side_by_side.out_path(__doc__.splitlines()[0])
    results, seconds = side_by_side.compare("images", start_choir, start_vllm, run_cases)
    lines = side_by_side.table(CASES, results)
    lines += ["", f"Every request: model {MODEL}, text {ASK!r} then the image(s), temperature 0, max_tokens 6, unless "
              "the row says otherwise. Both on the bundled VLM (16 tokens an image) with "
              f"`{' '.join(engine_flags()[2:])}`; Choir with its defaults (no image fetching, 40 MP, 10 MiB an image, "
              f"16 MiB a body); {seconds:.0f} s in all."]
    side_by_side.publish(lines, out)


if __name__ == "__main__":
    main()
