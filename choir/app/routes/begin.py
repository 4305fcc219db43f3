"""The start every generation handler shares: the operation's compat rules on the raw body, strict
parsing into the wire type, and the response id (logged with the request)."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from litestar import Request

from choir.app.request_ids import request_base_id
from choir.app.request_log import annotate
from choir.app.serving.counts import TokenCounts
from choir.app.serving.jobs import Job
from choir.plugins.pipeline import Pipeline

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Begun(Generic[T]):
    body: T  # the request body as its wire type
    base_id: str  # X-Request-Id, else the body's request_id, else random: echoed in the response header
    response_id: str  # the base id with the endpoint's prefix


def begin(request: Request, pipeline: Pipeline, raw: Any, wire_type: type[T], prefix: str) -> Begun[T]:
    body = pipeline.compat.admit(raw, wire_type)
    base_id = request_base_id(request, getattr(body, "request_id", None) or getattr(body, "rid", None))
    response_id = f"{prefix}{base_id}"
    annotate(request.scope, response_id=response_id)
    return Begun(body, base_id, response_id)


def counted(request: Request, job: Job | Sequence[Job]) -> TokenCounts:
    """The token counts the request's log line reports: the prompt's now, the completion's when it ends
    (of every job of a batch)."""
    jobs = [job] if isinstance(job, Job) else job
    counts = TokenCounts(prompt_tokens=sum(each.prompt_tokens for each in jobs))
    annotate(request.scope, tokens=counts)
    return counts
