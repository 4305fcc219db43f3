"""JSON a model cannot write forever. A grammar lets a model loop wherever the JSON schema has no end:
whitespace between tokens, and the digits of an integer without bounds (xgrammar bounds an integer's
digits only when the schema sets both `minimum` and `maximum`). A forced tool call or a json_schema
answer whose strings are bounded must still finish, so:

- whitespace: Choir's engine defaults turn vLLM's `--structured-outputs-config.disable_any_whitespace`
  on (choir/core/settings.py); the JSON parts of a structural tag, which that flag does not reach, get
  xgrammar's own `max_whitespace_cnt` here;
- integers: a bound the schema leaves out becomes ±(2**53 − 1), the integers every JSON parser reads
  exactly (I-JSON, RFC 7493); a bound the schema sets is kept.
"""

from typing import Any

SAFE_INTEGER = 2**53 - 1
STRUCTURAL_TAG_WHITESPACE = 2  # whitespace characters at most between two JSON tokens of a structural tag
_DATA_KEYS = frozenset({"const", "enum", "default", "examples"})  # values there are data, not schemas


def bounded_integers(schema: Any) -> Any:
    """`schema` with each integer's missing `minimum`/`maximum` set (a copy; the request's own is kept)."""
    if isinstance(schema, list):
        return [bounded_integers(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    bounded = {key: value if key in _DATA_KEYS else bounded_integers(value) for key, value in schema.items()}
    kind = schema.get("type")
    if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
        if "minimum" not in schema and "exclusiveMinimum" not in schema:
            bounded["minimum"] = -SAFE_INTEGER
        if "maximum" not in schema and "exclusiveMaximum" not in schema:
            bounded["maximum"] = SAFE_INTEGER
    return bounded


def bounded_tag(tag: dict[str, Any]) -> dict[str, Any]:
    """A structural tag (as xgrammar dumps it) whose JSON parts have bounded whitespace and integers."""
    if tag.get("type") == "json_schema" and "json_schema" in tag:
        whitespace = tag.get("max_whitespace_cnt")
        return {**tag, "json_schema": bounded_integers(tag["json_schema"]),
                "max_whitespace_cnt": STRUCTURAL_TAG_WHITESPACE if whitespace is None else whitespace}
    return {key: _bounded_tag_value(value) for key, value in tag.items()}


def _bounded_tag_value(value: Any) -> Any:
    if isinstance(value, dict):
        return bounded_tag(value)
    if isinstance(value, list):
        return [_bounded_tag_value(item) for item in value]
    return value
