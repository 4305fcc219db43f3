"""A reasoning item's `encrypted_content` as Choir gives it out (with `include: ["reasoning.encrypted_content"]`)
and reads it back: clients that keep nothing on the server (`store: false`: Codex) send each turn's reasoning
back in that field alone. Not a secret (the same text is in the item's `content`), so not encrypted: the text,
compressed, under a prefix that says whose and which version it is."""

import base64
import zlib

PREFIX = "choir.reasoning.v1."
# Bytes the blobs of one request may expand to, all of them together: a forged one is refused, not inflated
# without bound (a blob of 11 KB can hold 8 MiB).
MAX_TEXT = 8 * 1024 * 1024


def encode(text: str) -> str:
    return PREFIX + base64.urlsafe_b64encode(zlib.compress(text.encode())).decode()


def decode(blob: str, room: int = MAX_TEXT) -> str | None:
    """The reasoning's text; None for a blob Choir did not make (another server's, damaged) or one whose text
    is longer than `room` bytes."""
    if not blob.startswith(PREFIX):
        return None
    try:
        inflate = zlib.decompressobj()
        text = inflate.decompress(base64.urlsafe_b64decode(blob[len(PREFIX):].encode()), room)
        if inflate.unconsumed_tail or not inflate.eof:
            return None
        return text.decode()
    except (ValueError, zlib.error, UnicodeDecodeError):
        return None
