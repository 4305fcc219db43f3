"""Images in requests, over the fake engine (which renders an image part as `<image>`): chat, Responses, Messages
and /tokenize hand them to the renderer, and every image the server cannot take is a 400 naming its part, before
the engine sees anything. The real renderer and processor: tests/integration/test_images.py."""

import asyncio
import base64
import http.server
import io
import random
import threading
import time

import pytest
from litestar.testing import TestClient
from PIL import Image

from choir.app.asgi import create_app
from choir.core.errors import EngineRejected
from choir.core.settings import Settings
from choir.engine.protocol import ImagesRejected
from choir.plugins.media import ImageRef, ImageRefused, MediaPolicy
from tests.fakes import FakeEngine, fake_engine_factory

CHAT = "/v1/chat/completions"


def png(width=4, height=4, color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, media_type="image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


PNG = data_url(png())


def image(url=PNG) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def user(*parts) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": "What is this?"}, *parts]}


def vlm(**settings):
    """A client over a fake engine that reads up to two images per prompt."""
    engine = FakeEngine(max_images=2, max_model_len=256)
    app = create_app(Settings(served_model_name="fake-model", **settings), engine_factory=fake_engine_factory(engine))
    return TestClient(app), engine


@pytest.fixture
def images():
    client, engine = vlm()
    with client:
        yield client, engine


def refused(response, param):
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError", error
    return error["message"]


# What reaches the renderer

def test_an_image_part_reaches_the_renderer_in_place(images):
    client, engine = images
    part = {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}
    body = client.post(CHAT, json={"messages": [user(part)], "max_tokens": 3}).json()
    assert body["choices"][0]["message"]["content"]
    [messages] = engine.conversations
    assert messages[0]["content"] == [{"type": "text", "text": "What is this?"},
                                      {"type": "image_url", "image_url": {"url": PNG}}]  # detail: vLLM ignores it
    assert "<image>" in engine.calls[0].prompt.text
    # usage counts the prompt the renderer made, its image tokens included
    assert body["usage"]["prompt_tokens"] == len(engine.calls[0].prompt.token_ids)


def test_the_children_of_n_share_one_rendered_image(images):
    client, engine = images
    body = client.post(CHAT, json={"messages": [user(image())], "n": 4, "max_tokens": 2, "seed": 1}).json()
    assert len(body["choices"]) == 4
    assert len(engine.conversations) == 1 and len(engine.calls) == 4  # one render, one processed image
    assert len({id(call.prompt.engine_input) for call in engine.calls}) == 1


def test_several_images_and_jpeg_webp_gif(images):
    client, engine = images
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, "JPEG")
    jpeg = data_url(out.getvalue(), "image/jpeg")
    assert client.post(CHAT, json={"messages": [user(image(), image(jpeg))], "max_tokens": 1}).status_code == 200
    assert engine.calls[-1].prompt.text.count("<image>") == 2
    for kind in ("WEBP", "GIF"):
        out = io.BytesIO()
        Image.new("RGB", (8, 8)).save(out, kind)
        url = data_url(out.getvalue(), f"image/{kind.lower()}")
        assert client.post(CHAT, json={"messages": [user(image(url))], "max_tokens": 1}).status_code == 200
    out = io.BytesIO()  # a phone camera's JPEG: a second picture after the first (PIL says MPO)
    Image.new("RGB", (8, 8)).save(out, "MPO", save_all=True, append_images=[Image.new("RGB", (4, 4))])
    assert out.getvalue()[:3] == b"\xff\xd8\xff"
    url = data_url(out.getvalue(), "image/jpeg")
    assert client.post(CHAT, json={"messages": [user(image(url))], "max_tokens": 1}).status_code == 200


def test_tokenize_counts_what_a_chat_request_sends(images):
    client, engine = images
    messages = [user(image())]
    tokens = client.post("/tokenize", json={"messages": messages}).json()["tokens"]
    client.post(CHAT, json={"messages": messages, "max_tokens": 1})
    assert tokens == engine.calls[0].prompt.token_ids


def test_responses_input_image_reaches_the_renderer(images):
    client, engine = images
    response = client.post("/v1/responses", json={"model": "fake-model", "max_output_tokens": 2, "store": False,
                                                  "input": [{"role": "user", "content": [
                                                      {"type": "input_text", "text": "Describe"},
                                                      {"type": "input_image", "image_url": PNG, "detail": "high"}]}]})
    assert response.status_code == 200, response.text
    assert engine.conversations[0][-1]["content"][1] == {"type": "image_url", "image_url": {"url": PNG}}


def test_anthropic_image_blocks_reach_the_renderer(images):
    client, engine = images
    data = base64.b64encode(png()).decode()
    response = client.post("/v1/messages", json={"model": "fake-model", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "screenshot"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "and this?"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": data}}]}]})
    assert response.status_code == 200, response.text
    messages = engine.conversations[0]
    # a tool result's image joins the user message after the tool message (chat's tool messages hold text)
    assert [m["role"] for m in messages] == ["tool", "user", "assistant", "user"]
    assert messages[0]["content"] == "screenshot"
    assert messages[1]["content"] == [{"type": "image_url", "image_url": {"url": PNG}}]
    assert messages[3]["content"] == [{"type": "text", "text": "and this?"}, image()]


# Refused, each named where the client put it

def test_a_text_only_model_refuses_images_naming_the_part(client, fake_engine):
    messages = [{"role": "system", "content": "x"}, user(image())]
    assert "reads text only" in refused(client.post(CHAT, json={"messages": messages}), "messages[1].content[1]")
    assert refused(client.post("/tokenize", json={"messages": messages}), "messages[1].content[1]")
    assert not fake_engine.calls and not fake_engine.conversations


def test_more_images_than_the_limit_names_the_first_one_over(images):
    client, engine = images
    message = refused(client.post(CHAT, json={"messages": [user(image()), user(image(), image())]}),
                      "messages[1].content[2]")
    assert "At most 2 image(s)" in message and not engine.calls


BROKEN_PNG = png()[:-20] + b"\x00" * 20  # the last chunks' checksums are wrong


@pytest.mark.parametrize("url, says", [
    (data_url(b"not an image at all"), "not an image"),
    (data_url(BROKEN_PNG), "damaged"),
    ("data:image/png;base64,%%%not-base64%%%", "not valid base64"),
    (data_url(png(), "text/plain"), "`text/plain` is not an image type"),
    (data_url(png(), "application/pdf"), "`application/pdf` is not an image type"),
    ("data:image/png,rawbytes", "base64"),
    ("file:///etc/passwd", "data URL"),
    ("ftp://example.com/a.png", "data URL"),
    ("https://example.com/cat.png", "not fetched"),
])
def test_an_image_the_server_cannot_take_is_a_400_naming_it(images, url, says):
    client, engine = images
    message = refused(client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}, user(image(url))]}),
                      "messages[1].content[1]")
    assert says in message, message
    assert not engine.calls


def test_a_bmp_is_not_a_served_type(images):
    client, _ = images
    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, "BMP")
    assert "BMP" in refused(client.post(CHAT, json={"messages": [user(image(data_url(out.getvalue())))]}),
                            "messages[0].content[1]")


def test_size_and_pixel_limits():
    client, engine = vlm(max_image_bytes=1000, max_image_pixels=10_000)
    with client:
        noisy = Image.frombytes("L", (64, 64), random.Random(0).randbytes(64 * 64))  # incompressible
        out = io.BytesIO()
        noisy.save(out, "PNG")
        assert "CHOIR_MAX_IMAGE_BYTES" in refused(
            client.post(CHAT, json={"messages": [user(image(data_url(out.getvalue())))]}), "messages[0].content[1]")
        # a tiny file of many pixels (a decompression bomb) is refused from its header, before any decoding
        bomb = png(200, 200)
        assert len(bomb) < 1000
        assert "200 × 200" in refused(client.post(CHAT, json={"messages": [user(image(data_url(bomb)))]}),
                                      "messages[0].content[1]")
        assert not engine.calls


def test_mm_kwargs_need_the_trust_setting(images):
    client, engine = images
    for name, value in (("mm_processor_kwargs", {"do_resize": False}),
                        ("media_io_kwargs", {"image": {"image_mode": "RGBA"}})):
        assert "CHOIR_TRUST_REQUEST_MM_KWARGS" in refused(
            client.post(CHAT, json={"messages": [user(image())], name: value}), name)
        assert refused(client.post("/tokenize", json={"messages": [user(image())], name: value}), name)
    trusted, engine = vlm(trust_request_mm_kwargs=True)
    with trusted:
        assert trusted.post(CHAT, json={"messages": [user(image())], "max_tokens": 1,
                                        "mm_processor_kwargs": {"do_resize": False},
                                        "media_io_kwargs": {"image": {"image_mode": "RGBA"}}}).status_code == 200
    template = engine.templates[0]
    assert template.mm_processor_kwargs == {"do_resize": False}
    assert template.media_io_kwargs == {"image": {"image_mode": "RGBA"}}


def test_responses_and_messages_name_their_own_parts(images):
    client, _ = images
    bad = data_url(b"garbage")
    response = client.post("/v1/responses", json={"model": "fake-model", "store": False, "input": [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": PNG},
                                     {"type": "input_image", "image_url": bad}]}]})
    assert "not an image" in refused(response, "input[1].content[2]")
    response = client.post("/v1/responses", json={"model": "fake-model", "store": False, "input": [
        {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]})
    assert "Files API" in refused(response, "input[0].content[0]")
    response = client.post("/v1/messages", json={"model": "fake-model", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image", "source": {
            "type": "base64", "media_type": "image/bmp", "data": "AAAA"}}]}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("messages.0.content.1: `image/bmp` is not an image type"), error
    response = client.post("/v1/messages", json={"model": "fake-model", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]})
    assert response.json()["error"]["message"].startswith("messages.0.content.0.source: "), response.text


# Fetching: off by default, then only from the allowed hosts, bounded

class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the standard library's name
        if self.path == "/cat.png":
            body = png(6, 6)
        elif self.path == "/big.png":
            body = b"\x89PNG" + b"\x00" * 5000
        elif self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", "http://elsewhere.example/cat.png")
            self.end_headers()
            return
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def image_host():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_urls_are_fetched_from_allowed_hosts_only(image_host, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    client, engine = vlm(media_domains=("127.0.0.1",), max_image_bytes=2000)
    with client:
        assert client.post(CHAT, json={"messages": [user(image(f"{image_host}/cat.png"))],
                                       "max_tokens": 1}).status_code == 200
        # the renderer gets the fetched bytes: vLLM never fetches, so never from elsewhere
        assert engine.conversations[0][0]["content"][1]["image_url"]["url"] == data_url(png(6, 6))
        for path, says in (("/missing.png", "answered 404"), ("/moved.png", "answered 302"),
                           ("/big.png", "5004 bytes, more than this server takes (2000")):
            assert says in refused(client.post(CHAT, json={"messages": [user(image(f"{image_host}{path}"))]}),
                                   "messages[0].content[1]")
        other = image_host.replace("127.0.0.1", "localhost")
        assert "not from localhost" in refused(client.post(CHAT, json={"messages": [user(image(f"{other}/cat.png"))]}),
                                               "messages[0].content[1]")
        assert len(engine.calls) == 1


def test_a_slow_image_host_times_out():
    listener = __import__("socket").create_server(("127.0.0.1", 0))  # accepts, never answers
    client, _ = vlm(media_domains=("127.0.0.1",), media_fetch_seconds=1)
    try:
        with client:
            url = f"http://127.0.0.1:{listener.getsockname()[1]}/slow.png"
            assert "within 1 s" in refused(client.post(CHAT, json={"messages": [user(image(url))]}),
                                           "messages[0].content[1]")
    finally:
        listener.close()


# Off the event loop

def test_checking_a_large_image_never_holds_the_event_loop(monkeypatch):
    """The checks run in threads, a few at a time: the loop keeps serving while they work."""
    policy = MediaPolicy(checks=1)
    busy = []

    def slow_inspect(self, data, name):
        busy.append(threading.current_thread() is not threading.main_thread())
        time.sleep(0.3)
        return "image/png"

    monkeypatch.setattr(MediaPolicy, "_inspect", slow_inspect)

    async def run():
        ticks = 0

        async def heartbeat():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beat = asyncio.create_task(heartbeat())
        parts = [ImageRef({"type": "image_url", "image_url": {"url": PNG}}, f"messages[0].content[{j}]")
                 for j in range(2)]
        await policy.load(parts, max_images=2)
        beat.cancel()
        return ticks

    ticks = asyncio.run(run())
    assert busy == [True, True]  # each check in a worker thread, one after the other (checks=1)
    assert ticks >= 20  # the loop ran all along: ~0.6 s of checks, a tick every 10 ms


def test_the_first_bad_image_in_order_is_the_answer():
    policy = MediaPolicy()
    parts = [ImageRef({"type": "image_url", "image_url": {"url": PNG}}, "a"),
             ImageRef({"type": "image_url", "image_url": {"url": data_url(b"x")}}, "b"),
             ImageRef({"type": "image_url", "image_url": {"url": "https://h/c.png"}}, "c")]
    with pytest.raises(ImageRefused) as refusal:
        asyncio.run(policy.load(parts, max_images=3))
    assert refusal.value.param == "b"



def test_a_stored_conversation_keeps_its_images(store_url):
    """previous_response_id: the earlier turn's image is rendered again with the history; input_items lists it."""
    engine = FakeEngine(max_images=2, max_model_len=256)
    app = create_app(Settings(served_model_name="fake-model", store_url=store_url),
                     engine_factory=fake_engine_factory(engine))
    with TestClient(app) as client:
        first = client.post("/v1/responses", json={"model": "fake-model", "max_output_tokens": 2, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Look"},
                                         {"type": "input_image", "image_url": PNG}]}]}).json()
        items = client.get(f"/v1/responses/{first['id']}/input_items").json()["data"]
        assert items[0]["content"][1] == {"type": "input_image", "image_url": PNG}  # as the request sent it
        second = client.post("/v1/responses", json={"model": "fake-model", "max_output_tokens": 2,
                                                    "previous_response_id": first["id"], "input": "And now?"})
        assert second.status_code == 200, second.text
        history = engine.conversations[-1]
        assert history[0]["content"] == [{"type": "text", "text": "Look"}, image()]
        assert engine.calls[-1].prompt.text.count("<image>") == 1
        # one image more than the model takes: the new one is named, the stored one is not to blame
        over = client.post("/v1/responses", json={"model": "fake-model", "previous_response_id": first["id"],
                                                  "input": [{"role": "user", "content": [
                                                      {"type": "input_image", "image_url": PNG},
                                                      {"type": "input_image", "image_url": PNG}]}]})
        assert "At most 2 image(s)" in refused(over, "input[0].content[1]")


# Edge forms

def test_a_data_url_reaches_the_renderer_in_the_one_form_vllm_reads(images):
    client, engine = images
    payload = base64.b64encode(png()).decode()
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, "JPEG")
    jpeg = base64.b64encode(out.getvalue()).decode()
    for sent, reaches in ((f"DATA:image/PNG;BASE64,{payload}", PNG),  # vLLM: NotImplementedError, a 500
                          (f"data:image/png;charset=utf-8;base64,{payload}", PNG),
                          (f"data:image/jpg;base64,{jpeg}", f"data:image/jpeg;base64,{jpeg}"),
                          (PNG, PNG)):
        assert client.post(CHAT, json={"messages": [user(image(sent))], "max_tokens": 1}).status_code == 200
        assert engine.conversations[-1][0]["content"][1]["image_url"]["url"] == reaches


def test_urls_that_cannot_be_fetched_are_named(image_host):
    client, engine = vlm(media_domains=("127.0.0.1",))
    with client:
        for url in ("http://[::1/cat.png", "http://127.0.0.1:99999/cat.png", "http://127.0.0.1:1/cat.png",
                    "http:///cat.png", "https://127.0.0.1:bad/cat.png"):
            response = client.post(CHAT, json={"messages": [user(image(url))]})
            assert response.status_code == 400, (url, response.text)
            assert response.json()["error"]["param"] == "messages[0].content[1]", (url, response.text)
        assert not engine.calls


def test_several_tool_results_keep_their_images_in_order(images):
    client, engine = images
    red, blue = png(color=(255, 0, 0)), png(color=(0, 0, 255))

    def result(call, data):
        return {"type": "tool_result", "tool_use_id": call, "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(data).decode()}}]}

    response = client.post("/v1/messages", json={"model": "fake-model", "max_tokens": 2, "messages": [
        {"role": "user", "content": [result("t1", red), result("t2", blue), {"type": "text", "text": "which?"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/bmp",
                                                                  "data": "Qk0="}}]}]})
    # the turn's own image is named where it is, though the results' images come before it
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("messages.0.content.3: "), response.text
    response = client.post("/v1/messages", json={"model": "fake-model", "max_tokens": 2, "messages": [
        {"role": "user", "content": [result("t1", red), result("t2", blue), {"type": "text", "text": "which?"}]}]})
    assert response.status_code == 200, response.text
    user_turn = engine.conversations[-1][-1]["content"]
    assert user_turn == [image(data_url(red)), image(data_url(blue)), {"type": "text", "text": "which?"}]


def test_the_renderers_refusal_names_a_sole_image(images, monkeypatch):
    """vLLM's loader refuses a truncated JPEG that PIL's header checks pass; it names no image."""
    client, engine = images

    async def refuse(messages, template, options=None):
        raise ImagesRejected("The images cannot be processed for the model: Failed to load image: image file is "
                             "truncated.", "messages")

    monkeypatch.setattr(engine, "render_chat", refuse)
    assert "truncated" in refused(client.post(CHAT, json={"messages": [user(image())]}), "messages[0].content[1]")
    assert "truncated" in refused(client.post("/tokenize", json={"messages": [user(image())]}),
                                  "messages[0].content[1]")
    # two images: which one is not known
    refused(client.post(CHAT, json={"messages": [user(image(), image())]}), "messages")


def test_a_template_refusal_is_not_the_images(images, monkeypatch):
    """The chat template's refusal of a request with one image stays the messages' (and Anthropic's inline system
    turns are folded and tried again, as without images)."""
    client, engine = images
    render = engine.render_chat
    refusals = []

    async def strict(messages, template, options=None):
        if any(m["role"] == "system" for m in messages[1:]):  # a template that takes a system message only first
            refusals.append(messages)
            raise EngineRejected("The messages cannot be rendered with the model's chat template: System message "
                                 "must be first.", "messages")
        return await render(messages, template, options)

    monkeypatch.setattr(engine, "render_chat", strict)
    inline_system = [user(image()), {"role": "system", "content": "Be brief."}]
    assert "must be first" in refused(client.post(CHAT, json={"messages": inline_system}), "messages")
    data = base64.b64encode(png()).decode()
    response = client.post("/v1/messages", json={"model": "fake-model", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": data}}]},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "and now?"}]})
    assert response.status_code == 200, response.text
    assert len(refusals) == 2 and engine.conversations[-1][0]["role"] == "system"  # folded, then rendered


def _raise_from(filename: str):
    namespace: dict = {}
    exec(compile("def load():\n    raise ValueError('Failed to load image: truncated')\n", filename, "exec"), namespace)
    try:
        namespace["load"]()
    except ValueError as exc:
        return exc


def test_only_errors_from_vllms_media_code_are_the_images():
    from choir.engine.vllm.base import _raised_in_media_code

    loader = _raise_from("/site-packages/vllm/multimodal/media/image.py")
    template = _raise_from("/site-packages/vllm/renderers/hf.py")
    assert _raised_in_media_code(loader) and not _raised_in_media_code(template)
    try:  # vLLM wraps it: the chain is followed
        raise ValueError("wrapped") from loader
    except ValueError as wrapped:
        assert _raised_in_media_code(wrapped)
