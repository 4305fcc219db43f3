"""/v1/audio/transcriptions and /v1/audio/translations over a fake engine whose model "takes audio" (FakeSpeech: a
real WAV/FLAC reader, a 5 s window, scripted text): the form read and checked, the audio checked before decoding,
decoded in the audio policy's own threads, one engine request per chunk, and each response format; every error a
400 naming the field. The real Whisper engine: tests/integration/test_audio.py."""

import asyncio
import io
import json
import math
import threading
import time
from typing import Any

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from choir.engine.prompt import Prompt
from choir.engine.speech import Audio, Segment, Task
from tests.audio_files import wav
from tests.fakes import FakeEngine, encode, fake_engine_factory
from tests.test_errors import error_of

PATH = "/v1/audio/transcriptions"
WINDOW = 5.0


class FakeSpeech:
    """A speech model's side: decodes with soundfile, splits at WINDOW, prompts that name their chunk."""

    sample_rate = 16000
    window_seconds = WINDOW
    languages = {"en": "English", "de": "German", "ja": "Japanese"}
    detects_language = True
    timestamps = True
    no_space_languages = frozenset({"ja"})

    def __init__(self, decode_seconds: float = 0.0) -> None:
        self.decode_seconds = decode_seconds
        self.decoders: list[str] = []  # the thread each decode ran in
        self.decoding, self.most_decoding = 0, 0
        self.lock = threading.Lock()

    def decode(self, data: bytes, max_seconds: float) -> Audio:
        import soundfile

        with self.lock:
            self.decoders.append(threading.current_thread().name)
            self.decoding += 1
            self.most_decoding = max(self.most_decoding, self.decoding)
        try:
            time.sleep(self.decode_seconds)
            samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
            seconds = len(samples) / rate
            if seconds > max_seconds:
                raise ValueError(f"Audio exceeds maximum allowed duration of {max_seconds}s")
            count = max(1, math.ceil(seconds / WINDOW))
            return Audio(chunks=[f"chunk{i}" for i in range(count)], offsets=[i * WINDOW for i in range(count)],
                         seconds=seconds)
        finally:
            with self.lock:
                self.decoding -= 1

    async def prompts(self, audio: Audio, task: Task, language: str | None, prompt: str,
                      timestamps: bool) -> list[Prompt]:
        return [Prompt(token_ids=encode(f"{prompt}|{task}|{language}"), text=f"{chunk} {task} {language}",
                       engine_input=None) for chunk in audio.chunks]

    async def language_probe(self, audio: Audio) -> tuple[Prompt, list[int]]:
        return Prompt(token_ids=[1], text="probe", engine_input=None), [7, 8]

    def language_of(self, token_ids: list[int]) -> str:
        return "de"

    def segments(self, token_ids: list[int], logprobs: list[float], offset: float) -> list[Segment]:
        return [Segment(start=offset + 0.5, end=offset + 1.25, text=f" seg{int(offset)}", tokens=token_ids[:2],
                        avg_logprob=sum(logprobs) / len(logprobs), compression_ratio=1.0)]

    def clean(self, text: str) -> str:
        return text

    def stream_cleaner(self) -> Any:
        return lambda text, finished: text.upper() if finished else text  # marks what went through it

    def audio_tokens(self, seconds: float) -> int:
        return math.ceil(seconds * 10)


def script(prompt: str, params: Any) -> list[str]:
    if prompt == "probe":
        return ["d"]
    return [f" {prompt.split()[0]}", " said", " hi"]


def make_client(speech: Any = None, engine: FakeEngine | None = None, **settings: Any) -> TestClient:
    engine = engine or FakeEngine(max_model_len=256, script=script, speech=speech or FakeSpeech())
    app = create_app(Settings(served_model_name="fake-model", store_url=None, **settings),
                     engine_factory=fake_engine_factory(engine))
    return TestClient(app)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=256, script=script, speech=FakeSpeech())


@pytest.fixture
def client(engine):
    with make_client(engine=engine) as client:
        yield client


def post(client: TestClient, audio: bytes | None = None, path: str = PATH, name: str = "a.wav", **fields: Any):
    files = {"file": (name, wav(3) if audio is None else audio, "audio/wav")}
    return client.post(path, files=files, data={"model": "fake-model", **fields})


def test_a_transcription_is_the_chunks_text_with_the_audios_seconds(client, engine):
    answer = post(client, wav(12), language="en")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    # three chunks of the 5 s window, one engine request each, all sent, joined with a space
    assert answer.json() == {"text": " chunk0 said hi chunk1 said hi chunk2 said hi",
                             "usage": {"type": "duration", "seconds": 12}}
    ids = [call.request_id for call in engine.calls]
    base = answer.headers["x-request-id"]
    assert ids == [f"transcribe-{base}-{i}" for i in range(3)]
    assert all(call.params.temperature == 0.0 and call.params.max_tokens == 256 - len(call.prompt.token_ids)
               for call in engine.calls)


def test_without_a_language_the_model_names_it_first(client, engine):
    answer = post(client, response_format="verbose_json")
    assert answer.status_code == 200, answer.text
    probe, transcript = engine.calls
    assert probe.prompt.text == "probe" and probe.sampling.max_tokens == 1
    assert probe.sampling.allowed_token_ids == [7, 8] and probe.sampling.temperature == 0
    assert transcript.prompt.text == "chunk0 transcribe de"
    assert answer.json()["language"] == "german"  # OpenAI names the language


def test_verbose_json_has_the_segments_and_text_has_a_line(client, engine):
    verbose = post(client, wav(7), language="en", response_format="verbose_json", temperature="0.5",
                   **{"timestamp_granularities[]": "segment"}).json()
    assert verbose["task"] == "transcribe" and verbose["language"] == "english" and verbose["duration"] == 7.0
    assert verbose["text"] == " seg0 seg5" and verbose["usage"] == {"type": "duration", "seconds": 7}
    first, second = verbose["segments"]
    assert first["id"] == 0 and first["start"] == 0.5 and first["end"] == 1.25 and first["temperature"] == 0.5
    assert first["seek"] == 0  # where its chunk starts
    assert second["id"] == 1 and second["start"] == 5.5 and second["seek"] == 5 and second["avg_logprob"] == -0.5
    assert all(call.sampling.logprobs == 0 for call in engine.calls)  # the segments' logprobs
    text = post(client, language="en", response_format="text")
    assert text.headers["content-type"].startswith("text/plain") and text.text == " chunk0 said hi\n"


def test_srt_and_vtt_are_subtitles_of_the_segments(client):
    srt = post(client, wav(7), language="en", response_format="srt")
    assert srt.headers["content-type"].startswith("text/plain")
    assert srt.text == "1\n00:00:00,500 --> 00:00:01,250\nseg0\n\n2\n00:00:05,500 --> 00:00:06,250\nseg5\n"
    vtt = post(client, wav(7), language="en", response_format="vtt")
    assert vtt.text == "WEBVTT\n\n00:00:00.500 --> 00:00:01.250\nseg0\n\n00:00:05.500 --> 00:00:06.250\nseg5\n"


def test_a_translation_has_no_usage_and_runs_the_translate_task(client, engine):
    answer = post(client, path="/v1/audio/translations", language="de")
    assert answer.status_code == 200 and answer.json() == {"text": " chunk0 said hi"}
    assert engine.calls[-1].prompt.text == "chunk0 translate de"
    assert engine.calls[-1].request_id.startswith("translate-")


def test_a_language_written_without_spaces_joins_its_chunks_without_one(client):
    assert post(client, wav(7), language="ja").json()["text"] == " chunk0 said hi chunk1 said hi".replace(
        "hi chunk1", "hichunk1")


def events(response) -> list[Any]:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in response.text.splitlines() if line.startswith("data: ")]


def test_a_stream_is_openais_transcript_events(client, engine):
    answer = post(client, wav(7), language="en", stream="true")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    got = events(answer)
    assert got[-1] == "[DONE]"
    deltas = [e["delta"] for e in got if isinstance(e, dict) and e["type"] == "transcript.text.delta"]
    # each chunk's last piece went through the model's streaming post-processor (the fake's: upper case)
    assert deltas == [" chunk0", " said", " HI", " chunk1", " said", " HI"]
    done = got[-2]
    assert done["type"] == "transcript.text.done" and done["text"] == "".join(deltas)
    prompt_tokens = sum(len(call.prompt.token_ids) for call in engine.calls) + 70  # + 7 s of audio tokens
    output_tokens = sum(len(encode(delta)) for delta in deltas)
    assert done["usage"] == {"type": "tokens", "input_tokens": prompt_tokens, "output_tokens": output_tokens,
                             "total_tokens": prompt_tokens + output_tokens}


def test_sampling_extras_reach_the_engine(client, engine):
    answer = post(client, language="en", seed="7", top_p="0.9", top_k="5", max_completion_tokens="2",
                  repetition_penalty="1.1", vllm_xargs='{"k": 1}')
    assert answer.status_code == 200, answer.text
    sampling = engine.calls[-1].sampling
    assert (sampling.seed, sampling.top_p, sampling.top_k, sampling.max_tokens) == (7, 0.9, 5, 2)
    assert sampling.repetition_penalty == 1.1 and sampling.extra_args == {"k": 1}


def test_decoding_runs_in_the_audio_threads_a_few_at_a_time():
    speech = FakeSpeech(decode_seconds=0.2)
    with make_client(speech, audio_decodes=1) as client:
        def one() -> int:
            return post(client, language="en").status_code

        async def burst() -> list[int]:
            return list(await asyncio.gather(*(asyncio.to_thread(one) for _ in range(3))))

        assert asyncio.run(burst()) == [200, 200, 200]
    assert speech.most_decoding == 1 and all(name.startswith("choir-audio") for name in speech.decoders)


@pytest.mark.parametrize("fields, param, fragment", [
    ({"temperature": "hot"}, "temperature", "Expected `float`"),
    ({"temperature": "1.5"}, "temperature", "from 0 to 1"),
    ({"response_format": "xml"}, "response_format", "Invalid enum value"),
    ({"response_format": "srt", "stream": "true"}, "response_format", "cannot be streamed"),
    ({"timestamp_granularities[]": "segment"}, "timestamp_granularities", "verbose_json"),
    ({"timestamp_granularities[]": "word", "response_format": "verbose_json"}, "timestamp_granularities", "Word"),
    ({"include[]": "logprobs"}, "include", "not served"),
    ({"chunking_strategy": "server_vad"}, "chunking_strategy", "auto"),
    ({"language": "xx"}, "language", "not a language"),
    ({"stream_include_usage": "true"}, "stream_include_usage", "stream=True"),
    ({"max_completion_tokens": "0"}, "max_completion_tokens", "at least 1"),
    ({"vllm_xargs": "{nope"}, "vllm_xargs", "JSON"),
    ({"speaker": "x"}, "speaker", "unknown field"),
    ({"model": "no-such-model"}, "model", "does not exist"),
    ({"prompt": "p" * 300}, "prompt", "leaving none"),
])
def test_a_bad_field_is_a_400_naming_it(client, engine, fields, param, fragment):
    assert fragment in error_of(post(client, **{"language": "en", **fields}), 400, param)
    assert engine.calls == []


def test_a_text_model_takes_no_audio():
    with make_client(engine=FakeEngine(script=script)) as client:
        assert "does not take audio" in error_of(post(client), 400, "model")


@pytest.mark.parametrize("audio, fragment", [
    (b"", "empty"),
    (b"hello, this is text and not audio at all", "not audio"),
    (b"RIFF\x00\x00\x00\x00WAVEfmt and then garbage", "not audio"),
])
def test_what_is_not_audio_is_a_400_naming_the_file(client, engine, audio, fragment):
    assert fragment in error_of(post(client, audio), 400, "file")
    assert engine.calls == []


def test_audio_too_long_by_its_header_is_refused_before_decoding():
    speech = FakeSpeech()
    with make_client(speech, max_audio_seconds=2) as client:
        assert "3.0 s long" in error_of(post(client, wav(3)), 400, "file")
    assert speech.decoders == []


def test_audio_found_too_long_while_decoding_is_a_400():
    speech = FakeSpeech()
    speech.decode = lambda data, max_seconds: (_ for _ in ()).throw(  # type: ignore[method-assign]
        ValueError("Audio exceeds maximum allowed duration of 1s"))
    with make_client(speech) as client:
        assert "longer than this server takes" in error_of(post(client, language="en"), 400, "file")


def test_an_upload_too_large_is_refused_while_it_streams_in(client):
    with make_client(max_audio_bytes=1000) as client:
        assert "CHOIR_MAX_AUDIO_BYTES" in error_of(post(client, wav(3)), 400, "file")

        def body():  # no Content-Length: found out while reading, a chunk at a time
            yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
            for _ in range(200):
                yield b"x" * 1024

        streamed = client.post(PATH, content=body(), headers={"content-type": "multipart/form-data; boundary=b"})
        assert "CHOIR_MAX_AUDIO_BYTES" in error_of(streamed, 400, "file")


def test_the_form_itself_is_checked(client):
    assert "`file` is required" in error_of(client.post(PATH, files={"x": ("a", b"1")}, data={"model": "m"}), 400,
                                            "file")
    as_text = client.post(PATH, files={"f": ("a", b"1")}, data={"file": "not a file", "model": "fake-model"})
    assert "`file` is required" in error_of(as_text, 400, "file")
    twice = client.post(PATH, files=[("file", ("a.wav", wav(1))), ("model", (None, "a")), ("model", (None, "b"))])
    assert "twice" in error_of(twice, 400, "model")
    file_field = client.post(PATH, files=[("file", ("a.wav", wav(1))), ("language", ("x.txt", b"en"))])
    assert "text field" in error_of(file_field, 400, "language")
    assert client.post(PATH, json={"model": "fake-model"}).status_code == 415


def test_a_stream_puts_one_separator_between_chunks_whatever_their_first_pieces():
    pieces = {"chunk0": ["a", "b"], "chunk1": ["", "c", "d"]}  # no leading spaces; chunk 1 starts empty
    engine = FakeEngine(max_model_len=256, speech=FakeSpeech(),
                        script=lambda prompt, params: pieces[prompt.split()[0]])
    with make_client(engine=engine) as client:
        got = events(post(client, wav(7), language="en", stream="true"))
        assert got[-2]["text"] == "aB cD"
    with make_client(engine=engine) as client:
        assert events(post(client, wav(7), language="ja", stream="true"))[-2]["text"] == "aBcD"


def test_one_chunk_refused_stops_the_others():
    def script(prompt: str, params: Any) -> list[str]:
        if prompt.startswith("chunk1"):
            from choir.core.errors import EngineRejected

            raise EngineRejected("refused for the test", "file")
        return ["x"] * 50

    engine = FakeEngine(max_model_len=256, speech=FakeSpeech(), script=script, delay=0.01)
    with make_client(engine=engine) as client:
        assert "refused for the test" in error_of(post(client, wav(12), language="en"), 400, "file")
    assert engine.running == set() and len(engine.aborted) == 2  # chunks 0 and 2, stopped mid-way


def test_a_text_field_in_a_bad_encoding_is_a_400(client):
    body = (b'--b\r\nContent-Disposition: form-data; name="language"\r\n\r\n\xff\xfe\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF\r\n--b--\r\n')
    answer = client.post(PATH, content=body, headers={"content-type": "multipart/form-data; boundary=b"})
    assert "UTF-8" in error_of(answer, 400)


def test_the_decoding_threads_end_with_the_app_and_start_again_with_it():
    speech = FakeSpeech()
    engine = FakeEngine(max_model_len=256, script=script, speech=speech)
    app = create_app(Settings(served_model_name="fake-model", store_url=None),
                     engine_factory=fake_engine_factory(engine))
    for _ in range(2):  # the same app started twice (litestar run, a test client reopened)
        with TestClient(app) as client:
            assert post(client, language="en").status_code == 200
        assert not any(thread.name.startswith("choir-audio") and thread.is_alive() for thread in threading.enumerate())
