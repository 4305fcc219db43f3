"""Images in a request, checked before vLLM's renderer sees them.

Each image part is checked where the client can still be told which one is wrong (`messages[1].content[0]`): the
model must read images, `--limit-mm-per-prompt` must allow one more, the URL must be a data URL of an image type
or an http(s) URL on an allowed host (fetching is off unless CHOIR_MEDIA_DOMAINS names hosts), and the bytes must
be an image within the size limits. Only the image's header and chunks are read here, in a thread, a few images at
a time; vLLM's renderer then decodes it (its media connector, with `media_io_kwargs`, in its own thread pool) and
its processor makes the image's tokens.
"""

import asyncio
import base64
import binascii
import functools
import io
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from choir.core.errors import APIError, bad_request
from choir.engine.protocol import ChatTemplateOptions, ImagesRejected, Prompt, RenderOptions, Tokenizing

# What a data URL may declare, and what the bytes may be (PIL's format names): OpenAI's and Anthropic's types.
MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif",
            "MPO": "image/jpeg"}  # a JPEG with more pictures after the first (phone cameras'): PIL names it MPO
_ALIASES = {"image/jpg": "image/jpeg"}
TEXT_ONLY = ("The served model reads text only: it takes no images. Serve a vision-language model to send them "
             "(docs/models.md).")


class ImageRefused(APIError):
    """An image part the request may not send; `param` names it in the caller's API (it needs no renaming)."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image part of a request's chat messages, and where the client put it."""

    part: dict[str, Any]  # {"type": "image_url", "image_url": {"url": ...}}: a fetched image's url becomes data
    name: str


def chat_images(messages: list[dict[str, Any]]) -> list[ImageRef]:
    """The image parts of chat messages, named as the chat API names them."""
    return [ImageRef(part, f"messages[{i}].content[{j}]")
            for i, message in enumerate(messages) if isinstance(message.get("content"), list)
            for j, part in enumerate(message["content"]) if part.get("type") == "image_url"]


async def render_images(engine: Tokenizing, messages: list[dict[str, Any]], template: ChatTemplateOptions,
                        options: RenderOptions, names: Sequence[str]) -> Prompt:
    """`engine.render_chat` for messages with images (`names`, checked by `MediaPolicy.prepare`). The renderer's
    refusal of them (vLLM's loader: a truncated JPEG, ...) names none: with one image in the request and no
    per-request kwargs to blame instead, it is that image."""
    try:
        return await engine.render_chat(messages, template, options)
    except ImagesRejected as exc:
        if len(names) != 1 or template.mm_processor_kwargs or template.media_io_kwargs:
            raise
        raise ImageRefused(exc.status, exc.message, names[0]) from exc


@dataclass(frozen=True, slots=True, eq=False)
class MediaPolicy:
    """The server's image limits (CHOIR_MEDIA_DOMAINS, CHOIR_MAX_IMAGE_BYTES, CHOIR_MAX_IMAGE_PIXELS,
    CHOIR_MEDIA_FETCH_SECONDS, CHOIR_TRUST_REQUEST_MM_KWARGS)."""

    domains: tuple[str, ...] = ()  # hosts whose image URLs are fetched; none: fetching is off
    max_bytes: int = 10 * 1024 * 1024
    max_pixels: int = 40_000_000
    fetch_seconds: float = 10.0
    trust_kwargs: bool = False
    checks: int = 2  # images read at once (each in a thread): a burst of large ones waits, the event loop never
    _gate: asyncio.Semaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_gate", asyncio.Semaphore(self.checks))

    def check_kwargs(self, mm_processor_kwargs: dict[str, Any] | None,
                     media_io_kwargs: dict[str, Any] | None) -> None:
        """vLLM's rule (--trust-request-mm-kwargs): per-request preprocessing kwargs only from trusted clients."""
        if self.trust_kwargs:
            return
        for name, value, what in (("mm_processor_kwargs", mm_processor_kwargs, "preprocessing"),
                                  ("media_io_kwargs", media_io_kwargs, "media loading")):
            if value:
                raise bad_request(f"Per-request {name} are off: they change what multimodal {what} costs. Start the "
                                  "server with CHOIR_TRUST_REQUEST_MM_KWARGS=true only when clients are trusted.",
                                  name)

    async def prepare(self, messages: list[dict[str, Any]], max_images: int,
                      mm_processor_kwargs: dict[str, Any] | None = None, media_io_kwargs: dict[str, Any] | None = None,
                      names: Sequence[str] | None = None) -> list[str]:
        """Chat messages' images checked (and fetched where allowed) before they are rendered, for a model that
        takes `max_images` per prompt; their names. `names`: where each image came from in another API's request
        (Responses', Messages'), in the messages' order."""
        self.check_kwargs(mm_processor_kwargs, media_io_kwargs)
        images = chat_images(messages)
        if names is not None:
            images = [ImageRef(image.part, name) for image, name in zip(images, names, strict=True)]
        if images:
            await self.load(images, max_images)
        return [image.name for image in images]

    async def load(self, images: Sequence[ImageRef], max_images: int) -> None:
        """Check every image (all of them, at once); the first refused, in the request's order, is the answer."""
        for index, image in enumerate(images):
            if max_images == 0:
                raise ImageRefused(400, TEXT_ONLY, image.name)
            if index >= max_images:
                raise ImageRefused(400, f"At most {max_images} image(s) may be provided in one prompt "
                                        "(the engine's --limit-mm-per-prompt).", image.name)
        results = await asyncio.gather(*(self._load(image) for image in images), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _load(self, image: ImageRef) -> None:
        source = image.part.get("image_url")
        url = source.get("url") if isinstance(source, dict) else None
        if source is None or not isinstance(url, str):
            raise ImageRefused(400, "An image part needs `image_url.url`: a data URL or an http(s) URL.", image.name)
        if url[:5].lower() == "data:":
            media_type, payload = self._data(url, image.name)
            async with self._gate:
                await asyncio.to_thread(self._inspect, payload, image.name)
            canonical = f"data:{media_type};base64,"
            if not url.startswith(canonical):  # `DATA:`, `;BASE64`, `;charset=...`: vLLM's loader reads one form
                source["url"] = canonical + payload
            return
        data = await self._fetch(url, image.name)
        async with self._gate:
            # vLLM's renderer reads it from here: the URL is not fetched twice, nor from elsewhere
            source["url"] = await asyncio.to_thread(self._as_data_url, data, image.name)

    def _data(self, url: str, name: str) -> tuple[str, str]:
        """A data URL's media type and base64 payload, once the declared type and size are acceptable."""
        spec, comma, payload = url[5:].partition(",")
        media_type, _, encoding = spec.rpartition(";")
        media_type = media_type.partition(";")[0].strip().lower()
        if not comma or encoding.strip().lower() != "base64":
            raise ImageRefused(400, "An image data URL is base64: data:image/png;base64,<data>.", name)
        media_type = _ALIASES.get(media_type, media_type)
        if media_type not in MEDIA_TYPES:
            raise ImageRefused(400, f"`{media_type or '(none)'}` is not an image type this server reads: send "
                                    f"{', '.join(MEDIA_TYPES)}.", name)
        if len(payload) * 3 // 4 > self.max_bytes + 2:
            raise ImageRefused(400, self._too_large(len(payload) * 3 // 4), name)
        return media_type, payload

    async def _fetch(self, url: str, name: str) -> bytes:
        import httpx

        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - checks it: `:99999` would get as far as the socket (an OverflowError)
        except ValueError as exc:  # `http://[::1`, `:99999`, `:bad`
            raise ImageRefused(400, f"The image URL is not a valid URL: {exc}.", name) from None
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ImageRefused(400, "An image URL is a data URL (data:image/png;base64,...) or an http(s) URL.", name)
        if not self.domains:
            raise ImageRefused(400, "Image URLs are not fetched by this server: send the image as a data URL "
                                    "(data:image/png;base64,...), or start it with CHOIR_MEDIA_DOMAINS listing the "
                                    "hosts it may fetch from.", name)
        if parts.hostname.lower() not in self.domains:
            raise ImageRefused(400, f"Images are fetched only from {', '.join(self.domains)} (CHOIR_MEDIA_DOMAINS), "
                                    f"not from {parts.hostname}.", name)
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.fetch_seconds), \
                    httpx.AsyncClient(follow_redirects=False, verify=_tls(), timeout=self.fetch_seconds) as client, \
                    client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise ImageRefused(400, f"The image URL answered {response.status_code}, not 200 with an image "
                                            "(redirects are not followed).", name)
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_bytes:
                    raise ImageRefused(400, self._too_large(int(declared)), name)
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ImageRefused(400, self._too_large(size, at_least=True), name)
                    chunks.append(chunk)
        except TimeoutError:
            raise ImageRefused(400, f"The image URL did not answer within {self.fetch_seconds:g} s.", name) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise ImageRefused(400, f"The image URL could not be fetched: {type(exc).__name__}.", name) from None
        return b"".join(chunks)

    def _as_data_url(self, data: bytes, name: str) -> str:
        """A fetched image as a data URL, once it is one (in a thread: base64 of megabytes takes milliseconds)."""
        return f"data:{self._inspect(data, name)};base64,{base64.b64encode(data).decode()}"

    def _inspect(self, data: str | bytes, name: str) -> str:
        """The image's media type, once its bytes are an image of a served type within the limits (in a thread:
        base64 and PIL's checks of a large image take milliseconds)."""
        from PIL import Image, UnidentifiedImageError

        if isinstance(data, str):
            try:
                data = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise ImageRefused(400, "The image data is not valid base64.", name) from None
        if len(data) > self.max_bytes:
            raise ImageRefused(400, self._too_large(len(data)), name)
        try:
            with Image.open(io.BytesIO(data)) as image:  # reads the header: no pixels are decoded yet
                kind, (width, height) = image.format, image.size
                if kind not in _FORMATS:
                    raise ImageRefused(400, f"The image is {kind}, not a type this server reads: send "
                                            f"{', '.join(MEDIA_TYPES)}.", name)
                if width * height > self.max_pixels:
                    raise ImageRefused(400, f"The image has {width} × {height} pixels, more than this server takes "
                                            f"({self.max_pixels}, CHOIR_MAX_IMAGE_PIXELS).", name)
                image.verify()  # the file's structure (PNG chunks and their checksums, ...), still no pixels
        except ImageRefused:
            raise
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as exc:
            reason = "not an image" if isinstance(exc, UnidentifiedImageError) else f"damaged ({exc})"
            raise ImageRefused(400, f"The image cannot be decoded: {reason}.", name) from None
        return _FORMATS[kind]

    def _too_large(self, size: int, at_least: bool = False) -> str:
        has = f"at least {size}" if at_least else str(size)  # at least: where a fetch stopped reading
        return f"The image has {has} bytes, more than this server takes ({self.max_bytes}, CHOIR_MAX_IMAGE_BYTES)."


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every fetch: loading the CA bundle costs milliseconds, each client would pay it."""
    import httpx

    return httpx.create_ssl_context()
