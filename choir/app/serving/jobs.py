"""A request as planned: its choices on the engine, and what every response or chunk of it carries."""

from dataclasses import dataclass, field
from typing import Any

from choir.core.compat import OperationCompat
from choir.plugins.aggregation import prompt_tokens
from choir.plugins.fanout import Choice


@dataclass(frozen=True, kw_only=True)
class Job:
    model: str
    response_id: str
    created: int
    choices: list[Choice]
    system_fingerprint: str | None = None  # set where the compat profile includes it
    keep: int | None = None  # best_of: the choices are candidates, of which this many per prompt are returned
    compat: OperationCompat = field(default_factory=OperationCompat)  # the operation's rules, for its answers

    @property
    def prompt_tokens(self) -> int:
        return prompt_tokens(self.choices)

    @property
    def envelope(self) -> dict[str, Any]:
        """The fields every response object and stream chunk of this request starts with."""
        fields: dict[str, Any] = {"id": self.response_id, "created": self.created, "model": self.model}
        if self.system_fingerprint is not None:
            fields["system_fingerprint"] = self.system_fingerprint
        return fields
