"""/v1/batches wire types: OpenAI's Batch API (a file of requests run apart from any client, answered in files)."""

from typing import Literal

import msgspec

from choir.core.protocol.conversations import Metadata

BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                      "cancelled"]


class BatchCreateRequest(msgspec.Struct, kw_only=True):
    input_file_id: str
    endpoint: BatchEndpoint
    completion_window: Literal["24h"]
    metadata: Metadata | None = None


class BatchError(msgspec.Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchRequestCounts(msgspec.Struct, kw_only=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class Batch(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts = msgspec.field(default_factory=BatchRequestCounts)
    metadata: dict[str, str] | None = None


class BatchList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
