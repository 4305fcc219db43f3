"""Audio parts in chat, /tokenize and Responses (`input_audio` with `data`/`format`, vLLM's `audio_url` data URL),
over a fake engine: checked before rendering (each refusal a 400 naming its part), then handed to the renderer as
sent. The real audio-language model: tests/integration/test_audio_parts.py."""

import base64

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from tests.audio_files import wav
from tests.fakes import FakeEngine, fake_engine_factory
from tests.test_errors import error_of

WAV = base64.b64encode(wav(1)).decode()


def audio(data: str = WAV, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def chat(*parts: dict) -> dict:
    return {"model": "fake-model", "max_tokens": 3,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Listen:"}, *parts]}]}


def make_client(max_audios: int = 1, **settings) -> tuple[TestClient, FakeEngine]:
    engine = FakeEngine(max_model_len=256, max_audios=max_audios)
    app = create_app(Settings(served_model_name="fake-model", store_url=None, **settings),
                     engine_factory=fake_engine_factory(engine))
    return TestClient(app), engine


@pytest.fixture
def served():
    client, engine = make_client(max_audios=2)
    with client:
        yield client, engine


def test_audio_parts_reach_the_renderer_as_sent(served):
    client, engine = served
    url = {"type": "audio_url", "audio_url": {"url": f"data:audio/wav;base64,{WAV}"}}
    answer = client.post("/v1/chat/completions", json=chat(audio(), url))
    assert answer.status_code == 200, answer.text
    parts = engine.conversations[-1][0]["content"]
    assert parts[1] == audio() and parts[2] == url
    counted = client.post("/tokenize", json={"model": "fake-model", "messages": chat(audio())["messages"]})
    assert counted.status_code == 200 and engine.conversations[-1][0]["content"][1] == audio()


def test_a_responses_input_audio_is_a_chat_audio_part(served):
    client, engine = served
    answer = client.post("/v1/responses", json={"model": "fake-model", "store": False, "max_output_tokens": 3,
                                                "input": [{"role": "user", "content": [
                                                    {"type": "input_text", "text": "Listen:"},
                                                    {"type": "input_audio",
                                                     "input_audio": {"data": WAV, "format": "wav"}}]}]})
    assert answer.status_code == 200, answer.text
    assert engine.conversations[-1][-1]["content"][1] == audio()


@pytest.mark.parametrize("parts, fragment", [
    ((audio("%%%"),), "not valid base64"),
    ((audio(base64.b64encode(b"plain text, not audio").decode()),), "cannot be read"),
    ((audio(""),), "empty"),
    (({"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}},), "not fetched"),
    ((audio(), audio(), audio()), "At most 2"),
])
def test_a_bad_audio_part_is_a_400_naming_it(served, parts, fragment):
    client, engine = served
    answer = client.post("/v1/chat/completions", json=chat(*parts))
    assert fragment in error_of(answer, 400, f"messages[0].content[{len(parts)}]")
    assert engine.calls == []


def test_a_model_that_hears_nothing_refuses_audio():
    client, engine = make_client(max_audios=0)
    with client:
        answer = client.post("/v1/chat/completions", json=chat(audio()))
        assert "takes no audio" in error_of(answer, 400, "messages[0].content[1]")
        tokenize = client.post("/tokenize", json={"model": "fake-model", "messages": chat(audio())["messages"]})
        assert "takes no audio" in error_of(tokenize, 400, "messages[0].content[1]")


def test_audio_over_the_limits_is_refused_before_rendering():
    client, engine = make_client(max_audio_bytes=1000)
    with client:
        assert "CHOIR_MAX_AUDIO_BYTES" in error_of(client.post("/v1/chat/completions", json=chat(audio())), 400,
                                                   "messages[0].content[1]")
    client, engine = make_client(max_audio_seconds=1)
    with client:
        long = base64.b64encode(wav(2)).decode()
        assert "CHOIR_MAX_AUDIO_SECONDS" in error_of(client.post("/v1/chat/completions", json=chat(audio(long))),
                                                     400, "messages[0].content[1]")
        assert engine.conversations == []


def test_a_format_that_is_not_a_word_is_refused(served):
    client, engine = served
    answer = client.post("/v1/chat/completions", json=chat(audio(fmt="a,b")))
    error_of(answer, 400, "messages[0].content[1].input_audio.format")


def test_a_responses_audio_part_is_named_as_sent():
    client, engine = make_client(max_audios=0)
    with client:
        answer = client.post("/v1/responses", json={"model": "fake-model", "store": False, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Listen:"},
                                         {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}]}]})
        assert "takes no audio" in error_of(answer, 400, "input[0].content[1]")
