"""Choir's and vLLM's speech to text side by side: /v1/audio/transcriptions and /v1/audio/translations.

Starts Choir and then vLLM's own OpenAI server (one at a time: two CPU engines) on the bundled tiny Whisper
(models/choir-tiny-whisper: a 5 s window) with the same engine flags (Choir's), sends each the same multipart
requests (greedy, seeded) and prints one Markdown table of what came back: the status; for a 200 the text's start
and usage (verbose_json: language, duration, segments; a stream: its events and whether it ends with [DONE]); for
an error its `param`, `type` and message.

    .venv/bin/python -m conformance.audio [--out FILE]
"""

import functools
import json
from pathlib import Path
from typing import Any

import httpx

from choir.core.settings import BUNDLED_SPEECH_DIR, Settings
from conformance import side_by_side
from conformance.images import error_facts, quoted
from tests.audio_files import encoded, wav
from tests.integration.server import Server, start_server, start_vllm_server

MODEL = "choir-tiny-whisper"
TIMEOUT = 120
TRANSCRIBE, TRANSLATE = "/v1/audio/transcriptions", "/v1/audio/translations"


def flac(seconds: float) -> bytes:
    return encoded(seconds, "FLAC")


THREE = wav(3)
# (name, what is asked, path, fields, the file)
CASES: list[tuple[str, str, str, dict[str, str], bytes]] = [
    ("json", "3 s WAV, `language=en`, seed 3", TRANSCRIBE, {"language": "en"}, THREE),
    ("text", "the same, `response_format=text`", TRANSCRIBE, {"language": "en", "response_format": "text"}, THREE),
    ("verbose", "the same, `verbose_json`, `timestamp_granularities[]=segment`", TRANSCRIBE,
     {"language": "en", "response_format": "verbose_json", "timestamp_granularities[]": "segment"}, THREE),
    ("srt", "the same, `srt`", TRANSCRIBE, {"language": "en", "response_format": "srt"}, THREE),
    ("vtt", "the same, `vtt`", TRANSCRIBE, {"language": "en", "response_format": "vtt"}, THREE),
    ("stream", "the same, `stream=true`", TRANSCRIBE, {"language": "en", "stream": "true"}, THREE),
    ("stream-usage", "`stream=true`, `stream_include_usage=true` (vLLM's field)", TRANSCRIBE,
     {"language": "en", "stream": "true", "stream_include_usage": "true"}, THREE),
    ("detect", "no `language`: the model detects it (`verbose_json`)", TRANSCRIBE,
     {"response_format": "verbose_json"}, THREE),
    ("long", "12 s WAV (the window is 5 s)", TRANSCRIBE, {"language": "en"}, wav(12)),
    ("flac", "2 s FLAC", TRANSCRIBE, {"language": "en"}, flac(2)),
    ("translate", "translation of the 3 s WAV", TRANSLATE, {}, THREE),
    ("prompt", "`prompt=the quick brown fox`", TRANSCRIBE, {"language": "en", "prompt": "the quick brown fox"},
     THREE),
    ("not-audio", "a text file", TRANSCRIBE, {"language": "en"}, b"this is text, not audio at all"),
    ("empty", "an empty file", TRANSCRIBE, {"language": "en"}, b""),
    ("damaged", "a WAV header, then garbage", TRANSCRIBE, {"language": "en"}, b"RIFF\0\0\0\0WAVEfmt garbage"),
    ("too-long", "11 min WAV at 8 kHz (10.6 MB; limit 600 s)", TRANSCRIBE, {"language": "en"}, wav(660, 8000)),
    ("too-large", "26 MB of zeros (limit 25 MB)", TRANSCRIBE, {"language": "en"}, bytes(26 * 1024 * 1024)),
    ("long-prompt", '`prompt="hello " * 200` (decoder context 128)', TRANSCRIBE,
     {"language": "en", "prompt": "hello " * 200}, THREE),
    ("bad-language", "`language=xx`", TRANSCRIBE, {"language": "xx"}, THREE),
    ("bad-temperature", "`temperature=hot`", TRANSCRIBE, {"language": "en", "temperature": "hot"}, THREE),
    ("bad-format", "`response_format=xml`", TRANSCRIBE, {"language": "en", "response_format": "xml"}, THREE),
    ("word", "`verbose_json`, `timestamp_granularities[]=word`", TRANSCRIBE,
     {"language": "en", "response_format": "verbose_json", "timestamp_granularities[]": "word"}, THREE),
    ("unknown-field", "`speaker=x` (no such field)", TRANSCRIBE, {"language": "en", "speaker": "x"}, THREE),
    ("unknown-model", "`model=no-such-model`", TRANSCRIBE, {"language": "en", "model": "no-such-model"}, THREE),
    ("after", "the 3 s WAV again, after all the above", TRANSCRIBE, {"language": "en"}, THREE),
]


def settings() -> Settings:
    return Settings(model=str(BUNDLED_SPEECH_DIR), served_model_name=MODEL)


def engine_flags() -> list[str]:
    from vllm.platforms import current_platform

    from choir.engine.vllm.args import engine_argv

    return engine_argv(settings(), on_cpu=current_platform.is_cpu())


def start_vllm(log: Path) -> Server:
    return start_vllm_server(log, engine_flags())


def start_choir(log: Path) -> Server:
    return start_server(log, env={"CHOIR_MODEL": str(BUNDLED_SPEECH_DIR), "CHOIR_STORE": "off",
                                  "CHOIR_LOG_LEVEL": "warning", "VLLM_CPU_KVCACHE_SPACE": "1"})


def describe_stream(text: str) -> list[str]:
    events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    kinds, content, usage, errors = [], "", None, []
    for event in events:
        if event == "[DONE]":
            continue
        data = json.loads(event)
        if "error" in data:
            errors += error_facts(data)
        kinds.append(data.get("type") or data.get("object"))
        content += data.get("delta") or "".join((c.get("delta") or {}).get("content") or ""
                                                for c in data.get("choices") or [])
        usage = data.get("usage") or usage
    kinds_seen = ", ".join(f"`{kind}`" for kind in dict.fromkeys(kinds))
    done = "yes" if events and events[-1] == "[DONE]" else "no"
    facts = [f"{len(events)} events ({kinds_seen}), ends with [DONE]: {done}",
             f"text {quoted(content)}"]
    if usage:
        facts.append("usage " + quoted(json.dumps(usage), 90))
    return facts + errors


def describe(response: httpx.Response) -> list[str]:
    facts = [f"**{response.status_code}**"]
    kind = response.headers.get("content-type", "")
    if "text/event-stream" in kind:
        return facts + describe_stream(response.text)
    if not kind.startswith("application/json"):
        return facts + [f"`{kind.split(';')[0]}`", quoted(response.text, 60)]
    data = response.json()
    if response.status_code != 200:
        return facts + error_facts(data)
    facts.append(f"text {quoted(data.get('text', ''))}")
    if "segments" in data:
        facts.append(f"language `{data.get('language')}`, duration {data.get('duration')}, "
                     f"{len(data['segments'] or [])} segments")
    if data.get("usage"):
        facts.append("usage " + quoted(json.dumps(data["usage"]), 60))
    return facts


def post(path: str, fields: dict[str, str], audio: bytes, base_url: str) -> httpx.Response:
    data: dict[str, Any] = {"model": MODEL, "temperature": "0", "seed": "3", **fields}
    return httpx.post(base_url + path, files={"file": ("audio.wav", audio)}, data=data, timeout=TIMEOUT)


def run_cases(server: Server) -> dict[str, str]:
    return side_by_side.run_each(server, [(name, functools.partial(post, path, fields, audio))
                                          for name, _, path, fields, audio in CASES], describe)


def main() -> None:
    out = side_by_side.out_path(__doc__.splitlines()[0])
    results, seconds = side_by_side.compare("audio", start_choir, start_vllm, run_cases)
    lines = side_by_side.table(CASES, results)
    lines += ["", f"Every request: model {MODEL}, temperature 0, seed 3, unless the row says otherwise. Both on the "
              f"bundled tiny Whisper with `{' '.join(engine_flags()[2:])}`; Choir with its defaults (25 MB, 600 s); "
              f"{seconds:.0f} s in all."]
    side_by_side.publish(lines, out)


if __name__ == "__main__":
    main()
