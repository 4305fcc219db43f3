"""Token counts of one request, filled in as it is served and logged when it ends."""

from dataclasses import dataclass


@dataclass(slots=True)
class TokenCounts:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # known once the last choice finished
