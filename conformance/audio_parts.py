"""Choir's and vLLM's audio parts side by side: chat and /tokenize with `input_audio` and `audio_url`.

Starts Choir and then vLLM's own OpenAI server (one at a time) on the bundled tiny audio-language model
(models/choir-tiny-audio: a Qwen2-Audio giving a second of audio 25 tokens) with the same engine flags (Choir's, with
`--limit-mm-per-prompt.audio 2`), sends each the same requests (greedy, few tokens) and prints one Markdown table, as
conformance/images.py does for images.

    .venv/bin/python -m conformance.audio_parts [--out FILE]
"""

import base64
import functools
from pathlib import Path
from typing import Any

import httpx

from choir.core.settings import BUNDLED_AUDIO_DIR, Settings
from conformance import side_by_side
from conformance.audio import flac, wav
from conformance.images import describe
from tests.integration.server import Server, start_server, start_vllm_server

MODEL = "choir-tiny-audio"
ENGINE_ARGS = ("--limit-mm-per-prompt.audio", "2")
TIMEOUT = 120
CHAT = "/v1/chat/completions"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def heard(data: str, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def url(address: str) -> dict:
    return {"type": "audio_url", "audio_url": {"url": address}}


def ask(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What do you hear?"}, *parts]}]


def chat(*parts: dict, **changes: Any) -> dict:
    return {"model": MODEL, "messages": ask(*parts), "max_tokens": 6, "temperature": 0, **changes}


THREE = b64(wav(3))
CASES: list[tuple[str, str, str, dict]] = [
    ("wav", "`input_audio`: a 3 s WAV", CHAT, chat(heard(THREE))),
    ("flac", "`input_audio`: a 2 s FLAC (`format: flac`)", CHAT, chat(heard(b64(flac(2)), "flac"))),
    ("audio-url", "`audio_url`: a 2 s WAV data URL", CHAT, chat(url(f"data:audio/wav;base64,{b64(wav(2))}"))),
    ("two", "two audio parts", CHAT, chat(heard(THREE), heard(b64(wav(2))))),
    ("three", "three audio parts (limit 2)", CHAT, chat(heard(THREE), heard(THREE), heard(THREE))),
    ("stream", "a 3 s WAV, stream, include_usage", CHAT,
     chat(heard(THREE), stream=True, stream_options={"include_usage": True})),
    ("tokenize", "/tokenize, `messages` with the 3 s WAV (the count)", "/tokenize",
     {"model": MODEL, "messages": ask(heard(THREE))}),
    ("tokenize-text", "/tokenize, the same text, no audio", "/tokenize", {"model": MODEL, "messages": ask()}),
    ("not-audio", "base64 of `not audio`", CHAT, chat(heard(b64(b"not audio")))),
    ("bad-base64", "`data: %%%`", CHAT, chat(heard("%%%"))),
    ("http-url", "`audio_url`: `http://127.0.0.1:9/a.wav` (nothing listens)", CHAT,
     chat(url("http://127.0.0.1:9/a.wav"))),
    ("long", "a 40 s WAV (the model's window is 30 s)", CHAT, chat(heard(b64(wav(40))))),
    ("after", "the 3 s WAV again, after all the above", CHAT, chat(heard(THREE))),
]


def engine_flags() -> list[str]:
    from vllm.platforms import current_platform

    from choir.engine.vllm.args import engine_argv

    settings = Settings(model=str(BUNDLED_AUDIO_DIR), served_model_name=MODEL, engine_args=ENGINE_ARGS)
    return engine_argv(settings, on_cpu=current_platform.is_cpu())


def start_vllm(log: Path) -> Server:
    return start_vllm_server(log, engine_flags())


def start_choir(log: Path) -> Server:
    return start_server(log, env={"CHOIR_MODEL": str(BUNDLED_AUDIO_DIR), "CHOIR_ENGINE_ARGS": " ".join(ENGINE_ARGS),
                                  "CHOIR_STORE": "off", "CHOIR_LOG_LEVEL": "warning", "VLLM_CPU_KVCACHE_SPACE": "1"})


def post(path: str, payload: dict, base_url: str) -> httpx.Response:
    return httpx.post(base_url + path, json=payload, timeout=TIMEOUT)


def run_cases(server: Server) -> dict[str, str]:
    return side_by_side.run_each(server, [(name, functools.partial(post, path, payload))
                                          for name, _, path, payload in CASES], describe)


def main() -> None:
    out = side_by_side.out_path(__doc__.splitlines()[0])
    results, seconds = side_by_side.compare("audio-parts", start_choir, start_vllm, run_cases)
    lines = side_by_side.table(CASES, results)
    lines += ["", f"Every chat request: model {MODEL}, text `What do you hear?` then the audio, temperature 0, "
              f"max_tokens 6, unless the row says otherwise. Both with `{' '.join(engine_flags()[2:])}`; "
              f"{seconds:.0f} s in all."]
    side_by_side.publish(lines, out)


if __name__ == "__main__":
    main()
