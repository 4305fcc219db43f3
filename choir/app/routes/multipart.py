"""Multipart uploads (files, audio): the body read as it comes and refused with a 413 once past the route's
bound, never buffered whole to find out; its parts as Litestar's parser reads them, closed after use."""

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Request
from litestar._multipart import parse_content_header, parse_multipart_form
from litestar.datastructures import UploadFile
from litestar.exceptions import ClientException

from choir.core.errors import APIError, bad_request

OVERHEAD = 64 * 1024  # the multipart framing and the small fields, beside the file itself


async def _bounded(request: Request, limit: int, too_large: APIError) -> AsyncGenerator[bytes, None]:
    """The body as it comes, `too_large` as soon as it passes `limit` (a Content-Length over it: before reading)."""
    if (request.content_length or 0) > limit:
        raise too_large
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            raise too_large
        yield chunk


@asynccontextmanager
async def multipart_form(request: Request, max_file_bytes: int, too_large: APIError, fields: str,
                         max_parts: int = 16) -> AsyncIterator[dict[str, Any]]:
    """The form's fields (an UploadFile for a file part), each sent once; 400s in OpenAI's shape for a body
    that is not a multipart form (`fields`: what it should hold, for the message)."""
    _, options = parse_content_header(request.headers.get("content-type", ""))
    boundary = options.get("boundary")
    if not boundary:
        raise bad_request(f"The body must be multipart/form-data with a boundary ({fields}).")
    try:
        form = await parse_multipart_form(_bounded(request, max_file_bytes + OVERHEAD, too_large), boundary.encode(),
                                          multipart_form_part_limit=max_parts)
    except (UnicodeDecodeError, LookupError):  # a text part in invalid UTF-8, or in a charset Python lacks
        raise bad_request("A text field of the multipart body is not valid UTF-8 (or names an unknown charset).") \
            from None
    except ClientException as exc:
        if exc.status_code == 413:
            raise
        raise bad_request(f"The multipart body has too many parts ({fields} are all it takes)."
                          if "Too Large" in exc.detail else f"The multipart body cannot be read: {exc.detail}.") \
            from None
    try:
        twice = next((name for name, value in form.items() if isinstance(value, list)
                      and not name.endswith("[]")), None)
        if twice is not None:
            raise bad_request(f"The field `{twice}` is sent twice: send each field once.", twice)
        yield form
    finally:
        for value in form.values():
            for part in value if isinstance(value, list) else [value]:
                if isinstance(part, UploadFile):
                    await part.close()


def text_field(form: dict[str, Any], name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None
