"""JSONReply (choir/app/routes/replies.py): what Litestar's own Response would send for a JSON answer, byte for
byte, on its shorter path; and Litestar's own path wherever the answer has what that path skips."""

import msgspec
import pytest
from litestar import Litestar, Response, post
from litestar.datastructures import Cookie, ResponseHeader
from litestar.testing import TestClient

from choir.app.routes.replies import JSONReply, _JSONBody


class Answer(msgspec.Struct):
    id: str
    text: str
    usage: dict[str, int]
    missing: int | None = None


ANSWER = Answer(id="cmpl-1", text="ünïcödé \"quoted\" ✓", usage={"prompt_tokens": 4})
HEADERS = {"x-request-id": "abc", "X-Other": "Value"}


def app(kind: type[Response], **reply: object) -> Litestar:
    @post("/answer", status_code=200)
    async def answer() -> Response:
        return kind(ANSWER, headers=HEADERS, **reply)

    return Litestar([answer], response_headers=[ResponseHeader(name="x-layer", value="1")])


def sent(kind: type[Response], **reply: object):
    with TestClient(app(kind, **reply)) as client:
        response = client.post("/answer")
        return response.status_code, response.headers.raw, response.content


def test_the_same_bytes_as_litestars_response():
    status, headers, body = sent(JSONReply)
    assert (status, headers, body) == sent(Response)
    assert msgspec.json.decode(body) == msgspec.to_builtins(ANSWER)
    assert (b"x-request-id", b"abc") in headers and (b"x-layer", b"1") in headers
    assert (b"content-length", str(len(body)).encode()) in headers


def test_a_status_of_its_own():
    assert sent(JSONReply, status_code=202)[0] == 202
    assert sent(JSONReply, status_code=202) == sent(Response, status_code=202)


@pytest.mark.parametrize("reply", [{"cookies": [Cookie(key="k", value="v")]}], ids=["cookies"])
def test_what_it_skips_goes_litestars_way(reply):
    status, headers, body = sent(JSONReply, **reply)
    assert (status, headers, body) == sent(Response, **reply)
    assert any(name == b"set-cookie" for name, _ in headers)


def test_the_short_path_is_taken():
    reply = JSONReply(ANSWER, headers=HEADERS)
    assert isinstance(reply.to_asgi_response(None, None, headers={}, status_code=200), _JSONBody)
    with_cookie = JSONReply(ANSWER, headers=HEADERS, cookies=[Cookie(key="k", value="v")])
    assert not isinstance(with_cookie.to_asgi_response(None, None, headers={}, status_code=200), _JSONBody)
