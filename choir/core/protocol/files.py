"""/v1/files wire types: OpenAI's Files API, as far as the Batch API needs it (purpose `batch`)."""

from typing import Literal

import msgspec


class OpenAIFile(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"  # deprecated by OpenAI, still sent


class FileList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[OpenAIFile]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class DeletedFile(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
