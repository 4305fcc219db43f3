"""JSON text as strict parsers read it. vLLM's JSON grammar (xgrammar 0.2.8) lets a string hold raw
control characters (a literal tab, measured in a forced call's arguments on the real engine), which
JSON forbids: Python's `json.loads`, and so most clients, refuse such text. `JsonEscaper` writes each
as its escape (`\\t`, `\\u001b`), which decodes to the same character: the same JSON value, now valid.
It works chunk by chunk, so a stream and the whole answer escape alike."""

_SHORT = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class JsonEscaper:
    __slots__ = ("escaped", "in_string")

    def __init__(self) -> None:
        self.in_string = self.escaped = False

    def feed(self, text: str) -> str:
        if not self.in_string and '"' not in text:
            return text  # the common case outside strings: nothing to look at
        out = []
        for ch in text:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                elif ch < " ":
                    ch = _SHORT.get(ch) or f"\\u{ord(ch):04x}"
            elif ch == '"':
                self.in_string = True
            out.append(ch)
        return "".join(out)


def escaped(text: str) -> str:
    return JsonEscaper().feed(text)
