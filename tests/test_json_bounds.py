"""Bounds on what a grammar lets a model write forever: integers' digits, a structural tag's whitespace."""

import json

from choir.app.serving.json_bounds import SAFE_INTEGER, STRUCTURAL_TAG_WHITESPACE, bounded_integers, bounded_tag


def test_an_integer_without_bounds_gets_the_json_safe_range():
    schema = {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer", "minimum": 1}, "c": {"type": ["integer", "null"]},
        "d": {"type": "integer", "exclusiveMaximum": 10}, "e": {"type": "number"}, "f": {"type": "string"},
        "g": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "integer", "maximum": 3}]}}},
        "$defs": {"N": {"type": "integer"}}, "default": {"type": "integer"}}
    original = json.dumps(schema)
    out = bounded_integers(schema)
    props = out["properties"]
    assert (props["a"]["minimum"], props["a"]["maximum"]) == (-SAFE_INTEGER, SAFE_INTEGER)
    assert (props["b"]["minimum"], props["b"]["maximum"]) == (1, SAFE_INTEGER)
    assert props["c"]["maximum"] == SAFE_INTEGER
    assert props["d"] == {"type": "integer", "exclusiveMaximum": 10, "minimum": -SAFE_INTEGER}
    assert props["e"] == {"type": "number"} and props["f"] == {"type": "string"}
    assert props["g"]["items"]["anyOf"][1] == {"type": "integer", "maximum": 3, "minimum": -SAFE_INTEGER}
    assert out["$defs"]["N"]["maximum"] == SAFE_INTEGER
    assert out["default"] == {"type": "integer"}  # data, not a schema
    assert json.dumps(schema) == original  # the request's own schema is left as it was
    assert bounded_integers(True) is True


def test_a_structural_tags_json_parts_get_bounded_whitespace():
    tag = {"type": "structural_tag", "format": {"type": "or", "elements": [
        {"type": "tag", "begin": "<a>", "content": {"type": "json_schema", "json_schema": {"type": "integer"},
                                                    "max_whitespace_cnt": None}, "end": "</a>"},
        {"type": "json_schema", "json_schema": {"type": "object"}, "max_whitespace_cnt": 7}]}}
    out = bounded_tag(tag)
    first, second = out["format"]["elements"]
    assert first["content"]["max_whitespace_cnt"] == STRUCTURAL_TAG_WHITESPACE
    assert first["content"]["json_schema"]["maximum"] == SAFE_INTEGER
    assert second["max_whitespace_cnt"] == 7 and first["begin"] == "<a>"
