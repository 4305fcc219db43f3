"""Speech to text on the real engine: the tiny Whisper (models/choir-tiny-whisper, vLLM's own Whisper code and
processor) behind Choir, through the OpenAI SDK: every response format, a stream, a translation, audio longer than
the model's window split into engine requests, the containers soundfile and FFmpeg read, and the checks before
decoding; the text model's server refuses audio. docs/api/audio.md's example runs here."""

import re
from pathlib import Path

import httpx
import openai
import pytest

from choir.core.settings import BUNDLED_SPEECH_DIR
from tests.audio_files import encoded, wav
from tests.integration.server import start_server

pytestmark = pytest.mark.engine

MAX_SECONDS = 30
MAX_BYTES = 2_000_000
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("whisper") / "server.log", env={
        "CHOIR_MODEL": str(BUNDLED_SPEECH_DIR), "CHOIR_MAX_AUDIO_SECONDS": str(MAX_SECONDS),
        "CHOIR_MAX_AUDIO_BYTES": str(MAX_BYTES)})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sdk(whisper) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{whisper.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


MODEL = "choir-tiny-whisper"


def finished_requests(base_url: str) -> float:
    metrics = httpx.get(f"{base_url}/metrics").text
    return sum(float(value) for value in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", metrics, re.M))


def test_a_transcription_in_every_format(sdk):
    audio = wav(3)
    seeded = {"seed": 3}  # vLLM's field: the SDK sends extra_body as form fields
    first = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en", extra_body=seeded)
    assert first.text.strip() and first.usage.type == "duration" and first.usage.seconds == 3
    again = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en", extra_body=seeded)
    assert again.text == first.text  # greedy and seeded: the same audio, the same text
    text = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en", response_format="text")
    assert text.strip() == first.text.strip()
    verbose = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en",
                                              response_format="verbose_json", timestamp_granularities=["segment"])
    assert verbose.language == "english" and verbose.duration == 3.0 and verbose.task == "transcribe"
    # The tiny Whisper writes no two timestamps in a row here (its timestamps are rare by design), so no segment
    # closes: no text, no cues, as vLLM's server answers too (docs/api/audio.md's table). Timestamps read into
    # segments: tests/test_speech_segments.py (the same code, scripted tokens).
    assert verbose.segments == [] and verbose.text == ""
    srt = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en", response_format="srt")
    vtt = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en", response_format="vtt")
    assert srt == "" and vtt == "WEBVTT\n\n"


def test_without_a_language_whisper_detects_one(sdk):
    verbose = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", wav(2)), response_format="verbose_json")
    assert verbose.language.isalpha() and verbose.language.islower()


def test_a_stream_is_delta_events_then_done(sdk):
    events = list(sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", wav(3)), language="en",
                                                  extra_body={"seed": 3}, stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = events[-1]
    assert deltas and done.type == "transcript.text.done" and done.text == "".join(deltas)
    # 4 decoder prompt tokens and 300 for the audio (its mel frames: 3 s at 100 a second), as vLLM counts them
    assert done.usage.input_tokens == 304 and done.usage.output_tokens > 0
    whole = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", wav(3)), language="en",
                                            extra_body={"seed": 3})
    assert done.text == whole.text
    # three chunks: the same text streamed as answered whole, joined the same way
    events = list(sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", wav(12)), language="en",
                                                  extra_body={"seed": 3}, stream=True))
    whole = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", wav(12)), language="en",
                                            extra_body={"seed": 3})
    assert events[-1].text == whole.text


def test_a_translation(sdk):
    english = sdk.audio.translations.create(model=MODEL, file=("a.wav", wav(2)))
    assert english.text.strip()


def test_audio_longer_than_the_window_is_split_into_requests(sdk, whisper):
    before = finished_requests(whisper.base_url)
    long = sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", wav(12)), language="en")
    assert long.usage.seconds == 12 and long.text.strip()
    assert finished_requests(whisper.base_url) - before == 3  # 12 s in the tiny model's 5 s window


@pytest.mark.parametrize("container", ["FLAC", "OGG", "M4A"])
def test_other_containers_are_read(sdk, container):
    answer = sdk.audio.transcriptions.create(model=MODEL, file=(f"a.{container.lower()}", encoded(2, container)),
                                             language="en")
    assert answer.text.strip() and answer.usage.seconds in (2, 3)  # AAC pads a frame or two


def test_bad_audio_is_a_400_naming_the_file(sdk, whisper):
    cases = [(b"this is text, not audio", "cannot be read"),
             (wav(MAX_SECONDS + 1), f"{MAX_SECONDS:g} s"),
             (b"\x00" * (MAX_BYTES + 1), "CHOIR_MAX_AUDIO_BYTES")]
    for audio, fragment in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en")
        assert refused.value.body["param"] == "file" and fragment in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as long_prompt:
        sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", wav(1)), language="en", prompt="hello " * 200)
    assert long_prompt.value.body["param"] == "prompt"
    assert sdk.audio.transcriptions.create(model=MODEL, file=("a.wav", wav(1)), language="en").text  # still serving


def test_a_text_model_refuses_audio(client, model):
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(model=model, file=("a.wav", wav(1)))
    assert refused.value.body["param"] == "model" and "does not take audio" in refused.value.body["message"]


def test_the_docs_example_runs(whisper, capsys):
    blocks = re.findall(r"^```python\n(.*?)^```", (DOCS / "api" / "audio.md").read_text(), re.M | re.S)
    block = blocks[0]  # the transcriptions' (the realtime one: tests/integration/test_realtime.py)
    assert "client.audio.transcriptions.create" in block
    exec(compile(block.replace("http://127.0.0.1:8000", whisper.base_url), "audio.md example", "exec"), {})
    assert "transcript.text.done" in capsys.readouterr().out
