"""Images on the real engine: the bundled tiny vision-language model (models/choir-tiny-vlm: a LLaVA whose CLIP tower
gives each image 16 tokens) through the OpenAI and anthropic SDKs, and side by side with vLLM's own server on the
same model and flags (the same tokens for the same seed, the same /tokenize). The bundled text model refuses images
(the session's server)."""

import base64
import io
import os
import threading

import anthropic
import httpx
import openai
import pytest
from PIL import Image

from choir.core.settings import BUNDLED_VLM_DIR, Settings
from tests.integration.server import Server, start_server, start_vllm_server

pytestmark = pytest.mark.engine
MODEL = "choir-tiny-vlm"
IMAGE_TOKENS = 16  # (56 / 14)² patches, the class token dropped
ENGINE_ARGS = "--limit-mm-per-prompt.image 2"


def png(color, size=(32, 24)) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


RED, BLUE = png((220, 30, 30)), png((20, 40, 230))


def image(url):
    return {"type": "image_url", "image_url": {"url": url}}


def ask(*images, text="What is in the picture?"):
    return [{"role": "user", "content": [{"type": "text", "text": text}, *(image(url) for url in images)]}]


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("vlm") / "server.log",
                          env={"CHOIR_MODEL": str(BUNDLED_VLM_DIR), "CHOIR_ENGINE_ARGS": ENGINE_ARGS,
                               "CHOIR_TRUST_REQUEST_MM_KWARGS": "true", "VLLM_CPU_KVCACHE_SPACE": "1"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def vlm(vlm_server):
    return openai.OpenAI(base_url=f"{vlm_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def tokens(server: Server, messages, **extra) -> list[int]:
    response = httpx.post(f"{server.base_url}/tokenize", json={"model": MODEL, "messages": messages, **extra},
                          timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def test_an_image_is_its_tokens_in_the_prompt_and_in_usage(vlm, vlm_server):
    text_only = len(tokens(vlm_server, ask()))
    one, two = tokens(vlm_server, ask(RED)), tokens(vlm_server, ask(RED, BLUE))
    assert len(one) == text_only + IMAGE_TOKENS and len(two) == text_only + 2 * IMAGE_TOKENS
    answer = vlm.chat.completions.create(model=MODEL, messages=ask(RED), max_tokens=6, temperature=0)
    assert answer.usage.prompt_tokens == len(one)
    assert answer.choices[0].message.content and answer.choices[0].finish_reason == "length"


def test_the_image_changes_the_answer(vlm):
    """The model sees the pixels: two images, two greedy answers (the random weights read them differently)."""
    red = vlm.chat.completions.create(model=MODEL, messages=ask(RED), max_tokens=8, temperature=0)
    blue = vlm.chat.completions.create(model=MODEL, messages=ask(BLUE), max_tokens=8, temperature=0)
    again = vlm.chat.completions.create(model=MODEL, messages=ask(RED), max_tokens=8, temperature=0)
    assert red.choices[0].message.content == again.choices[0].message.content
    assert red.choices[0].message.content != blue.choices[0].message.content


def test_streaming_and_n_with_an_image(vlm):
    whole = vlm.chat.completions.create(model=MODEL, messages=ask(RED, BLUE), max_tokens=6, temperature=0)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in vlm.chat.completions.create(
        model=MODEL, messages=ask(RED, BLUE), max_tokens=6, temperature=0, stream=True) if chunk.choices)
    assert streamed == whole.choices[0].message.content
    seeded = vlm.chat.completions.create(model=MODEL, messages=ask(RED), max_tokens=6, n=3, seed=11,
                                         temperature=1.0)
    assert sorted(choice.index for choice in seeded.choices) == [0, 1, 2]
    one = vlm.chat.completions.create(model=MODEL, messages=ask(RED), max_tokens=6, n=1, seed=11, temperature=1.0)
    # child i samples with seed + i, as vLLM's parallel sampling: the first child is the n=1 answer
    assert seeded.choices[0].message.content == one.choices[0].message.content
    assert seeded.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt (and its image) counted once


def test_responses_input_image(vlm):
    response = vlm.responses.create(model=MODEL, max_output_tokens=6, temperature=0, store=False, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is in the picture?"},
                                     {"type": "input_image", "image_url": RED, "detail": "auto"}]}])
    chat = vlm.chat.completions.create(model=MODEL, messages=ask(RED), max_tokens=6, temperature=0)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_anthropic_image_block(vlm_server, vlm):
    sdk = anthropic.Anthropic(base_url=vlm_server.base_url, api_key="unused", max_retries=0, timeout=120)
    data = RED.split(",", 1)[1]
    message = sdk.messages.create(model=MODEL, max_tokens=6, extra_body={"temperature": 0.0}, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is in the picture?"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": data}}]}])
    chat = vlm.chat.completions.create(model=MODEL, messages=ask(RED), max_tokens=6, temperature=0)
    assert message.content[0].text == chat.choices[0].message.content
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == chat.usage.prompt_tokens


def test_an_image_rendered_but_never_sent_is_sent_whole_later(vlm_server, vlm):
    """vLLM's processor cache takes an image it processed to be in the engine. A count of tokens, or a request
    refused once rendered (over the context), never reaches the engine: the next request with that image must still
    be answered (the engine asks for the data, and Choir renders it again; vLLM's own server answers a 500)."""
    sdk = anthropic.Anthropic(base_url=vlm_server.base_url, api_key="unused", max_retries=0, timeout=120)
    green = png((30, 200, 60))
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": green.split(",")[1]}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is in the picture?"}, block]}]
    counted = sdk.messages.count_tokens(model=MODEL, messages=messages)
    message = sdk.messages.create(model=MODEL, max_tokens=4, messages=messages)
    assert message.stop_reason == "max_tokens" and message.content[0].text
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == counted.input_tokens
    grey = png((128, 128, 128))
    with pytest.raises(openai.BadRequestError):  # rendered, then over the context (2048 tokens)
        vlm.chat.completions.create(model=MODEL, messages=ask(grey, text="word " * 2100), max_tokens=2)
    for stream in (False, True):
        answer = vlm.chat.completions.create(model=MODEL, messages=ask(grey), max_tokens=3, stream=stream)
        chunks = list(answer) if stream else [answer]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == ["length"]


def test_bad_images_are_400s_naming_the_part_and_nothing_breaks(vlm, vlm_server):
    cases = [
        (ask(RED, BLUE, RED), "messages[0].content[3]", "At most 2 image(s)"),
        (ask("data:image/png;base64," + base64.b64encode(b"not an image").decode()), "messages[0].content[1]",
         "not an image"),
        (ask("data:text/plain;base64,aGVsbG8="), "messages[0].content[1]", "not an image type"),
        (ask("https://example.com/cat.png"), "messages[0].content[1]", "not fetched"),
        (ask("http://127.0.0.1:99999/cat.png"), "messages[0].content[1]", "not a valid URL"),
        # its header whole, its scan cut: PIL's checks pass it, vLLM's loader refuses it when it decodes it
        (ask(_truncated_jpeg()), "messages[0].content[1]", "truncated"),
    ]
    for messages, param, says in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            vlm.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
        error = refused.value.body
        assert refused.value.status_code == 400 and error["param"] == param and says in error["message"], error
    # the server still answers, images and all, a data URL spelt `;BASE64` too (a 500 on vLLM's server)
    assert vlm.chat.completions.create(model=MODEL, messages=ask(RED), max_tokens=2).choices[0].message.content
    upper = vlm.chat.completions.create(model=MODEL, messages=ask(BLUE.replace(";base64,", ";BASE64,")),
                                        max_tokens=2, temperature=0)
    assert upper.usage.prompt_tokens == vlm.chat.completions.create(model=MODEL, messages=ask(BLUE), max_tokens=2,
                                                                    temperature=0).usage.prompt_tokens
    assert httpx.get(f"{vlm_server.base_url}/health").status_code == 200


def _truncated_jpeg() -> str:
    out = io.BytesIO()
    Image.frombytes("RGB", (256, 256), os.urandom(256 * 256 * 3)).save(out, "JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()[: out.tell() * 4 // 5]).decode()


def test_large_images_do_not_hold_up_other_requests(vlm):
    """Four 3000 × 3000 images (decoded and resized by vLLM in its thread pool) while text requests run: the text
    requests are answered, and so are the images."""
    big = png((90, 160, 40), size=(3000, 3000))
    results: list[str] = []

    def send_big():
        answer = vlm.chat.completions.create(model=MODEL, messages=ask(big), max_tokens=2)
        results.append(answer.choices[0].message.content)

    threads = [threading.Thread(target=send_big) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(5):
        assert vlm.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2).choices[0].message.content
    for thread in threads:
        thread.join(120)
    assert len(results) == 4 and all(results)


def test_a_text_only_model_refuses_an_image(client, model):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=[{"role": "system", "content": "x"}, *ask(RED)],
                                       max_tokens=2)
    assert refused.value.body["param"] == "messages[1].content[1]"
    assert "reads text only" in refused.value.body["message"]


# Side by side with vLLM's own server: the same model, the same engine flags

@pytest.fixture(scope="module")
def vllm_vlm(tmp_path_factory):
    from vllm.platforms import current_platform

    from choir.engine.vllm.args import engine_argv

    settings = Settings(model=str(BUNDLED_VLM_DIR), served_model_name=MODEL,
                        engine_args=("--limit-mm-per-prompt.image", "2"))
    server = start_vllm_server(tmp_path_factory.mktemp("vllm-vlm") / "vllm.log",
                               [*engine_argv(settings, on_cpu=current_platform.is_cpu()), "--trust-request-mm-kwargs"])
    yield server
    server.stop()


def test_the_same_tokens_as_vllms_server(vlm_server, vllm_vlm):
    """The same image twice in one message, sampled with a seed: Choir and vLLM give the same prompt (its image
    tokens) and the same completion tokens; /tokenize agrees too."""
    messages = ask(RED, RED, text="Compare them.")
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 1.0, "seed": 1234,
            "logprobs": True}
    ours = httpx.post(f"{vlm_server.base_url}/v1/chat/completions", json=body, timeout=120).json()
    theirs = httpx.post(f"{vllm_vlm.base_url}/v1/chat/completions", json=body, timeout=120).json()
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert [t["token"] for t in ours["choices"][0]["logprobs"]["content"]] == \
        [t["token"] for t in theirs["choices"][0]["logprobs"]["content"]]
    assert tokens(vlm_server, messages) == tokens(vllm_vlm, messages)


def test_mm_processor_kwargs_as_vllm_honours_them(vlm_server, vllm_vlm):
    """A processor kwarg changes what the model sees (no normalisation: other pixel values), alike on both."""
    body = {"model": MODEL, "messages": ask(BLUE), "max_tokens": 8, "temperature": 0}
    answers = {}
    for name, server in (("choir", vlm_server), ("vllm", vllm_vlm)):
        for kwargs in (None, {"do_normalize": False}):
            extra = {"mm_processor_kwargs": kwargs} if kwargs else {}
            response = httpx.post(f"{server.base_url}/v1/chat/completions", json={**body, **extra}, timeout=120)
            assert response.status_code == 200, response.text
            answers[name, bool(kwargs)] = response.json()["choices"][0]["message"]["content"]
    assert answers["choir", False] == answers["vllm", False] and answers["choir", True] == answers["vllm", True]
    assert answers["choir", False] != answers["choir", True]
