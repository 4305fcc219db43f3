"""Structured outputs: a forced tool's schema, `response_format`, or vLLM's own `structured_outputs`
(json, regex, choice, grammar, json_object, structural_tag) → the engine request's `Constraint`.
At most one of the three may constrain a request."""

import json
from typing import Any

import structlog

from choir.app.serving.json_bounds import bounded_integers, bounded_tag
from choir.core.errors import bad_request
from choir.core.protocol.chat import JsonObjectFormat, JsonSchemaFormat
from choir.core.protocol.common import StructuredOutputs
from choir.engine.parsing import RequestParsers
from choir.engine.sampling import Constraint

log = structlog.get_logger("choir.structured")
KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def structured_outputs(request: Any, tool_schema: dict[str, Any] | None = None) -> Constraint | None:
    response_format = getattr(request, "response_format", None)
    formatted = isinstance(response_format, (JsonObjectFormat, JsonSchemaFormat))
    own: StructuredOutputs | None = request.structured_outputs
    if request.regex is not None or request.ebnf is not None or getattr(request, "json_schema", None) is not None:
        own = _sglang_constraint(request, own, formatted or tool_schema is not None)
    if tool_schema is None and not formatted and own is None:
        return None  # the common case: unconstrained
    return Constraint(**_constraint(own, tool_schema, response_format, formatted))


def _constraint(own: StructuredOutputs | None, tool_schema: dict[str, Any] | None, response_format: Any,
                formatted: bool) -> dict[str, Any]:
    """The one constraint the request asks for, as Constraint's arguments."""
    if own is not None:
        if tool_schema is not None:
            raise bad_request("structured_outputs cannot be combined with tool_choice `required` or a named tool: "
                              "those constrain the output to the tool call already.", "structured_outputs")
        if formatted:
            raise bad_request("structured_outputs and response_format both constrain the output: send one of them.",
                              "structured_outputs")
        return _one_constraint(own)
    if tool_schema is not None:
        return {"json": bounded_integers(tool_schema)}
    if isinstance(response_format, JsonObjectFormat):
        return {"json_object": True}
    if response_format.json_schema.schema is None:
        raise bad_request("response_format `json_schema` needs `json_schema.schema`: the JSON schema the "
                          "output must follow.", "response_format.json_schema.schema")
    return {"json": bounded_integers(response_format.json_schema.schema)}


def calls_or_format(constraint: Constraint, parsers: RequestParsers, tool_parser: str | None) -> Constraint:
    """tool_choice `auto` with a response format (OpenAI serves it: the model calls a tool, or answers in the
    format): the format alone would make every call impossible, so the engine gets "the tool parser's calls,
    or the format" as a structural tag. A parser that cannot describe its calls so keeps the format alone,
    as vLLM's server does."""
    tag = parsers.calls_or(constraint)
    if tag is None:
        log.warning("tool_choice auto with a response format: the tool parser has no structural tag, so the "
                    "output follows the format and cannot call a tool", tool_parser=tool_parser)
        return constraint
    return Constraint(structural_tag=json.dumps(bounded_tag(tag)))


def _one_constraint(own: StructuredOutputs) -> dict[str, Any]:
    given = {kind: getattr(own, kind) for kind in KINDS if getattr(own, kind) is not None}
    if len(given) != 1:
        found = ", ".join(given) or "none"
        raise bad_request(f"structured_outputs takes exactly one constraint of {', '.join(KINDS)}; got {found}.",
                          "structured_outputs")
    [(kind, value)] = given.items()
    if kind == "json_object" and value is not True:
        raise bad_request("structured_outputs.json_object must be true (leave structured_outputs out for free text).",
                          "structured_outputs.json_object")
    if value in ("", []) or (kind == "choice" and any(not isinstance(c, str) for c in value)):
        raise bad_request(f"structured_outputs.{kind} must not be empty.", f"structured_outputs.{kind}")
    return given


# SGLang's top-level constraints, as vLLM's structured_outputs kinds.
_SGLANG_KINDS = {"regex": "regex", "ebnf": "grammar", "json_schema": "json"}


def _sglang_constraint(request: Any, own: StructuredOutputs | None, constrained: bool) -> StructuredOutputs:
    """SGLang's `regex`, `ebnf` (an EBNF grammar) and, on completions, `json_schema` (a schema as text):
    one constraint at most, as SGLang allows, not beside a response format, a forced tool or vLLM's own."""
    given = {name: getattr(request, name) for name in _SGLANG_KINDS if getattr(request, name, None) is not None}
    first = next(iter(given))
    if len(given) > 1 or constrained:
        raise bad_request("Only one of regex, json_schema, ebnf, response_format or a forced tool_choice can "
                          "constrain the output.", first)
    if own is not None:
        raise bad_request(f"{first} and structured_outputs both constrain the output: send one of them.", first)
    return StructuredOutputs(**{_SGLANG_KINDS[first]: given[first]})
