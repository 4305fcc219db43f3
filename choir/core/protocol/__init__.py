"""OpenAI wire types as msgspec Structs, one module per endpoint."""

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def parse_strict(data: Any, wire_type: type[T]) -> T:
    """A request body as `wire_type`, with no type coercion: `"n": "2"` is an error, not 2.

    Litestar converts bodies leniently, so handlers take them with `SkipValidation` and call this.
    """
    return msgspec.convert(data, wire_type, strict=True)


def without_none(value: Any) -> Any:
    """Wire data with its null fields left out (as vLLM's message dicts and chat templates expect)."""
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(v) for v in value]
    return value
