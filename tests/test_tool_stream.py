"""The `required` tool-call scanner, fed the same text split at every chunk size."""

import json

import pytest

from app.serving.tool_stream import ToolArrayScanner

TEXT = ('[{"name": "get_weather", "parameters": {"city": "Pa\\"ris}", "n": [1, {"x": 2}]}},\n'
        ' {"parameters": 5 , "name": "f2"}, {"name": "f3", "parameters": "s,}"}]')


@pytest.mark.parametrize("size", range(1, len(TEXT) + 1))
def test_names_and_arguments_whatever_the_chunking(size):
    scanner = ToolArrayScanner()
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for start in range(0, len(TEXT), size):
        for index, name, text in scanner.feed(TEXT[start:start + size]):
            if name is not None:
                assert index not in names  # announced once
                names[index] = name
            assert index in names  # arguments never come before their call's name
            arguments[index] = arguments.get(index, "") + text
    assert names == {0: "get_weather", 1: "f2", 2: "f3"}
    assert json.loads(arguments[0]) == {"city": 'Pa"ris}', "n": [1, {"x": 2}]}
    assert arguments[1] == "5" and json.loads(arguments[2]) == "s,}"
