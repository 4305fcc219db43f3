"""Audio parts on the real engine: the tiny Qwen2-Audio (models/choir-tiny-audio, vLLM's own Qwen2-Audio processor
and model) behind Choir, through the OpenAI SDK: chat with `input_audio` and `audio_url`, streamed and with n > 1,
Responses' `input_audio`, /tokenize counting the audio's tokens as the model's processor makes them (25 a second),
and refusals naming the part; the text model's server refuses audio parts."""

import base64

import httpx
import openai
import pytest

from choir.core.settings import BUNDLED_AUDIO_DIR
from tests.audio_files import encoded, wav
from tests.integration.server import start_server

pytestmark = pytest.mark.engine

MODEL = "choir-tiny-audio"


def part(seconds: float = 3, container: str | None = None) -> dict:
    data = wav(seconds) if container is None else encoded(seconds, container)
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}


def messages(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What do you hear?"}, *parts]}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("audio-lm") / "server.log",
                          env={"CHOIR_MODEL": str(BUNDLED_AUDIO_DIR),
                               "CHOIR_ENGINE_ARGS": "--limit-mm-per-prompt.audio 2"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sdk(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def count(base_url: str, *parts: dict) -> int:
    answer = httpx.post(f"{base_url}/tokenize", json={"model": MODEL, "messages": messages(*parts)}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["count"]


def test_chat_hears_audio_parts(sdk, served):
    one = sdk.chat.completions.create(model=MODEL, messages=messages(part()), max_tokens=5, temperature=0)
    assert one.choices[0].message.content and one.usage.prompt_tokens == count(served.base_url, part())
    url = {"type": "audio_url", "audio_url": {"url": f"data:audio/wav;base64,{base64.b64encode(wav(2)).decode()}"}}
    two = sdk.chat.completions.create(model=MODEL, messages=messages(part(), url), max_tokens=5, n=2, seed=1)
    assert len(two.choices) == 2 and two.usage.prompt_tokens > one.usage.prompt_tokens
    chunks = list(sdk.chat.completions.create(model=MODEL, messages=messages(part(2, "FLAC")), max_tokens=5,
                                              stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) and chunks[-1].usage


def test_tokenize_counts_the_audios_tokens(served):
    text, two, three = count(served.base_url), count(served.base_url, part(2)), count(served.base_url, part(3))
    # 25 a second (100 mel frames, halved by the encoder's conv and by its pooling), besides the placeholder's own
    assert three - two == 25 and two - text > 50


def test_responses_hear_input_audio(sdk):
    response = sdk.responses.create(model=MODEL, store=False, max_output_tokens=5, input=[{
        "role": "user", "content": [{"type": "input_text", "text": "What do you hear?"},
                                    {"type": "input_audio", "input_audio": part()["input_audio"]}]}])
    assert response.status == "incomplete" and response.output_text


def test_bad_audio_parts_are_400s_naming_them(sdk):
    bad = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"not audio").decode(), "format": "wav"}}
    for parts, param in (((bad,), "messages[0].content[1]"), ((part(), part(), part()), "messages[0].content[3]")):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.chat.completions.create(model=MODEL, messages=messages(*parts), max_tokens=3)
        assert refused.value.body["param"] == param
    assert sdk.chat.completions.create(model=MODEL, messages=messages(part()), max_tokens=3).choices  # still serving


def test_the_text_model_refuses_audio_parts(client, model):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=messages(part()), max_tokens=3)
    assert refused.value.body["param"] == "messages[0].content[1]"
    assert "takes no audio" in refused.value.body["message"]
