"""A batch's input file read and checked line by line, as OpenAI checks it before a batch runs: every bad line is
named by its number, and one bad line fails the whole batch (nothing is run)."""

import json
from dataclasses import dataclass
from typing import Any

from choir.core.protocol.batches import BatchError

MAX_REQUESTS = 50_000  # OpenAI's bound on one batch


@dataclass(frozen=True)
class BatchRequest:
    line: int  # 1-based, as an editor numbers it
    custom_id: str
    body: dict[str, Any]


def read_requests(content: bytes, endpoint: str) -> tuple[list[BatchRequest], list[BatchError]]:
    requests: list[BatchRequest] = []
    errors: list[BatchError] = []
    seen: set[str] = set()

    def bad(line: int, code: str, message: str, param: str | None = None) -> None:
        errors.append(BatchError(code=code, message=message, param=param, line=line))

    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError:
        return [], [BatchError(code="invalid_file", message="The input file is not UTF-8 text (JSON lines).")]
    # Lines end at "\n" alone: JSON strings may hold other line separators (U+2028) as they are.
    for number, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            bad(number, "invalid_json_line", "This line is not valid JSON.")
            continue
        if not isinstance(line, dict):
            bad(number, "invalid_json_line", "This line is not a JSON object.")
            continue
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            bad(number, "missing_required_parameter", "`custom_id` is required: a string naming this request.",
                "custom_id")
        elif custom_id in seen:
            bad(number, "duplicate_custom_id", f"`custom_id` '{custom_id}' is used by an earlier line.", "custom_id")
        if line.get("method") != "POST":
            bad(number, "invalid_method", "`method` must be POST.", "method")
        if line.get("url") != endpoint:
            bad(number, "mismatched_endpoint", f"`url` must be the batch's endpoint, {endpoint}.", "url")
        body = line.get("body")
        if not isinstance(body, dict):
            bad(number, "missing_required_parameter", "`body` is required: the request's JSON object.", "body")
        elif body.get("stream"):
            bad(number, "invalid_request", "A batch's requests are not streamed: leave `stream` out.", "body.stream")
        elif body.get("background"):
            bad(number, "invalid_request", "A batch's requests are answered in the batch: leave `background` out.",
                "body.background")
        if errors and errors[-1].line == number:
            continue
        assert isinstance(custom_id, str) and isinstance(body, dict)
        seen.add(custom_id)
        requests.append(BatchRequest(number, custom_id, body))
    if not requests and not errors:
        errors.append(BatchError(code="empty_file", message="The input file has no requests."))
    if len(requests) > MAX_REQUESTS:
        errors.append(BatchError(code="too_many_requests", message=f"A batch takes {MAX_REQUESTS} requests at most; "
                                 f"this file has {len(requests)}: split it."))
    return requests, errors
