"""The `required` tool-call scanner, fed the same text split at every chunk size."""

import json

import pytest

from choir.app.serving.tool_stream import ToolArrayScanner
from choir.app.serving.tools import one_entry_per_call

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


def test_one_entry_per_call_in_a_chunk():
    """A parser's deltas and the end-of-stream reconciliation can say the same call twice in one chunk:
    merged, header first, arguments in order, other calls untouched."""
    from choir.core.protocol.chat import DeltaFunctionCall, DeltaToolCall

    header = DeltaToolCall(index=0, id="call_1", type="function", function=DeltaFunctionCall(name="f", arguments=""))
    more = DeltaToolCall(index=0, function=DeltaFunctionCall(arguments='{"a"'))
    other = DeltaToolCall(index=1, id="call_2", type="function", function=DeltaFunctionCall(name="g", arguments="{"))
    rest = DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=": 1}"))
    merged = one_entry_per_call([header, more, other, rest])
    assert merged == [DeltaToolCall(index=0, id="call_1", type="function",
                                    function=DeltaFunctionCall(name="f", arguments='{"a": 1}')), other]
    assert one_entry_per_call([more, header]) == [DeltaToolCall(
        index=0, id="call_1", type="function", function=DeltaFunctionCall(name="f", arguments='{"a"'))]
    assert one_entry_per_call([header, other]) == [header, other]
