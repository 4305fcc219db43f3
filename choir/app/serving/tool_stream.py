"""Stream the calls of a `required` tool choice out of `[{"name": ..., "parameters": {...}}, ...]`
as its text arrives: a call's name once it is complete, then its arguments' raw JSON text as it grows.

A small incremental JSON scanner (depth, strings, keys) that reads each character once. The output
is constrained by a JSON schema, so it is JSON; the two keys may come in either order.
"""

ELEMENT = 2  # depth inside one call object: 1 is the array


class _Call:
    __slots__ = ("name", "announced", "args_start", "args_end", "sent")

    def __init__(self) -> None:
        self.name: str | None = None
        self.announced = False
        self.args_start: int | None = None
        self.args_end: int | None = None
        self.sent = 0  # argument characters already emitted


class ToolArrayScanner:
    def __init__(self) -> None:
        self.text = ""
        self.pos = 0
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.string_start = 0
        self.last_string: str | None = None
        self.key: str | None = None  # the key whose value is being read, in the current call
        self.awaiting_arguments = False  # after `"parameters":`, until the value's first character
        self.calls: list[_Call] = []

    def feed(self, delta: str) -> list[tuple[int, str | None, str]]:
        """(call index, its name when just complete else None, new argument text) for what `delta` adds."""
        self.text += delta
        self._scan()
        events = []
        for index, call in enumerate(self.calls):
            name = None
            if call.name is not None and not call.announced:
                call.announced, name = True, call.name
            arguments = ""
            if call.announced and call.args_start is not None:
                end = call.args_end if call.args_end is not None else len(self.text)
                arguments = self.text[call.args_start + call.sent:end]
                call.sent += len(arguments)
            if name is not None or arguments:
                events.append((index, name, arguments))
        return events

    def _scan(self) -> None:
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if self.awaiting_arguments and ch not in " \t\r\n":
                self.awaiting_arguments = False
                self.calls[-1].args_start = self.pos
            if self.in_string:
                self._string_char(ch)
            elif ch == '"':
                self.in_string, self.string_start = True, self.pos + 1
            elif ch in "{[":
                self.depth += 1
                if self.depth == ELEMENT and ch == "{":
                    self.calls.append(_Call())
            elif ch in "}]":
                self.depth -= 1
                if self.depth == ELEMENT:  # an object or array value of the call closed
                    self._end_arguments(self.pos + 1)
                elif self.depth == ELEMENT - 1:  # the call closed, after a scalar value
                    self._end_arguments(self.pos)
            elif self.depth == ELEMENT and ch == ":":
                self.key = self.last_string
                self.awaiting_arguments = self.key == "parameters"
            elif self.depth == ELEMENT and ch == ",":
                self._end_arguments(self.pos)
            self.pos += 1

    def _string_char(self, ch: str) -> None:
        if self.escaped:
            self.escaped = False
        elif ch == "\\":
            self.escaped = True
        elif ch == '"':
            self.in_string = False
            self.last_string = self.text[self.string_start:self.pos]
            if self.depth == ELEMENT and self.key == "name":
                self.calls[-1].name, self.key = self.last_string, None

    def _end_arguments(self, end: int) -> None:
        if self.key == "parameters" and self.calls and self.calls[-1].args_end is None:
            self.calls[-1].args_end = len(self.text[:end].rstrip())
        self.key = None
