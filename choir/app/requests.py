"""The request class: Litestar's, with a bound on how deep a JSON body may nest (CHOIR_MAX_JSON_DEPTH), and
a client that leaves before its body is read is a disconnect (499), as one that leaves later is, not a 500.

msgspec decodes nested arrays and objects recursively: past Python's recursion limit (about 1000 levels)
it raises RecursionError, and well before that, deep data would reach code that walks it recursively (a
schema's bounds, a chat template). The depth is counted on the bytes before decoding, and only for a body
with more brackets than the bound: the usual body costs two `bytes.count`."""

import re
from typing import Any, ClassVar

from litestar import Request
from litestar.exceptions import InternalServerException

from choir.app.routes.disconnect import ClientDisconnected
from choir.core.errors import bad_request
from choir.plugins.metrics import REQUEST_DISCONNECTS

# A bracket inside a string is text. Possessive, and the closing quote optional: an unclosed string is text
# to the end, in one pass (a pattern that can fail would retry from every later quote: quadratic).
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*+"?', re.S)
_BRACKETS = re.compile(rb"[\[\]{}]")
_OPENING = frozenset(b"[{")


def nests_deeper(body: bytes, bound: int) -> bool:
    """Whether the JSON text `body` nests arrays and objects more than `bound` levels deep."""
    if body.count(b"[") + body.count(b"{") <= bound:
        return False
    depth = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b"", body)):
        depth += 1 if bracket[0] in _OPENING else -1
        if depth > bound:
            return True
    return False


class ChoirRequest(Request):
    max_json_depth: ClassVar[int] = 128

    async def body(self) -> bytes:
        try:
            return await super().body()
        except InternalServerException:  # Litestar's word for a client that left before its body's end
            REQUEST_DISCONNECTS.inc()
            raise ClientDisconnected() from None

    async def json(self) -> Any:
        bound = self.max_json_depth
        if nests_deeper(await self.body(), bound):
            raise bad_request(f"The request body nests arrays and objects more than {bound} levels deep; this "
                              f"server accepts at most {bound} (CHOIR_MAX_JSON_DEPTH).")
        return await super().json()


def request_class(max_json_depth: int) -> type[ChoirRequest]:
    return type("ChoirRequest", (ChoirRequest,), {"max_json_depth": max_json_depth})
