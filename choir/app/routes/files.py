"""The Files API (/v1/files), as the Batch API needs it: upload (multipart, `purpose: batch`), list, describe,
read back and delete; each file its API key's only (choir/plugins/store/files.py). The upload is read as it
comes and refused with a 413 once past CHOIR_MAX_FILE_BYTES, never buffered whole to find out."""

from typing import Any, Literal

from litestar import Request, Response
from litestar.datastructures import UploadFile

from choir.app.routes.multipart import multipart_form, text_field
from choir.app.routes.responses import store_and_owner
from choir.core.errors import APIError, bad_request
from choir.core.protocol.files import DeletedFile, FileList, OpenAIFile
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation
from choir.plugins.store.models import StoredFile
from choir.plugins.store.store import Store

PURPOSES = ("batch",)
MIN_EXPIRY, MAX_EXPIRY = 3600, 30 * 24 * 3600  # OpenAI's bounds on `expires_after[seconds]`
MAX_FILENAME = 512  # characters kept of a file's name (the store's column)


def as_file(row: StoredFile) -> OpenAIFile:
    return OpenAIFile(id=row.id, bytes=row.size, created_at=row.created_at, expires_at=row.expires_at,
                      filename=row.filename, purpose=row.purpose)


def file_not_found(file_id: str, param: str = "file_id") -> APIError:
    return APIError(404, f"No file with id '{file_id}' is stored for this API key.", param)


def files_of(request: Request, pipeline: PipelineDependency) -> tuple[Store, str]:
    """The store and the request's owner; a 400 on a server without a store."""
    store, owner = store_and_owner(request, pipeline)
    if store is None:
        raise bad_request("Files and batches need the store, and this server runs without one (CHOIR_STORE=off).")
    return store, owner


@operation("createFile")
async def create_file(request: Request, pipeline: PipelineDependency) -> OpenAIFile:
    store, owner = files_of(request, pipeline)
    too_large = APIError(413, f"The file is larger than this server takes ({store.files.max_bytes} bytes, "
                              "CHOIR_MAX_FILE_BYTES).", "file")
    async with multipart_form(request, store.files.max_bytes, too_large, "fields `file` and `purpose`") as form:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise bad_request("`file` is required: the file to upload, as a multipart file field.", "file")
        purpose = text_field(form, "purpose")
        if purpose not in PURPOSES:
            raise bad_request(f"`purpose` must be one of {', '.join(PURPOSES)} (Choir stores files for the Batch API "
                              f"only), not {purpose!r}.", "purpose")
        expires_after = _expiry(form)
        content = await upload.read()
    if len(content) > store.files.max_bytes:
        raise too_large
    name = (upload.filename or "file").replace("\x00", "")[:MAX_FILENAME] or "file"
    return as_file(await store.files.create(owner, name, purpose, content, expires_after))


def _expiry(form: dict[str, Any]) -> int | None:
    anchor, seconds = text_field(form, "expires_after[anchor]"), text_field(form, "expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise bad_request("`expires_after[anchor]` must be `created_at`.", "expires_after.anchor")
    if seconds is None or not (seconds.isascii() and seconds.isdigit()) or not MIN_EXPIRY <= int(seconds) <= MAX_EXPIRY:
        raise bad_request(f"`expires_after[seconds]` must be an integer from {MIN_EXPIRY} to {MAX_EXPIRY}.",
                          "expires_after.seconds")
    return int(seconds)


@operation("listFiles")
async def list_files(request: Request, pipeline: PipelineDependency, purpose: str | None = None,
                     after: str | None = None, limit: int = 10000,
                     order: Literal["asc", "desc"] = "desc") -> FileList:
    if not 1 <= limit <= 10000:
        raise bad_request("`limit` must be from 1 to 10000.", "limit")
    store, owner = files_of(request, pipeline)
    rows, has_more = await store.files.list(owner, purpose, after, limit, order)
    data = [as_file(row) for row in rows]
    return FileList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                    has_more=has_more)


@operation("retrieveFile")
async def retrieve_file(file_id: str, request: Request, pipeline: PipelineDependency) -> OpenAIFile:
    store, owner = files_of(request, pipeline)
    row = await store.files.get(owner, file_id)
    if row is None:
        raise file_not_found(file_id)
    return as_file(row)


@operation("downloadFile")
async def download_file(file_id: str, request: Request, pipeline: PipelineDependency) -> Response[bytes]:
    store, owner = files_of(request, pipeline)
    content = await store.files.content(owner, file_id)
    if content is None:
        raise file_not_found(file_id)
    return Response(content, media_type="application/octet-stream")


@operation("deleteFile")
async def delete_file(file_id: str, request: Request, pipeline: PipelineDependency) -> DeletedFile:
    store, owner = files_of(request, pipeline)
    if not await store.files.delete(owner, file_id):
        raise file_not_found(file_id)
    return DeletedFile(id=file_id)


FILE_HANDLERS = [create_file, list_files, retrieve_file, download_file, delete_file]
