"""Tool calls read out of a chat choice's text while it streams.

Two shapes are calls: Hermes blocks, `<tool_call>{json}</tool_call>` anywhere in the
text (the text around them is content), and a bare JSON value that is the whole
output, as the forced-call grammar writes it. Either JSON is one call object,
`{"name": N, "arguments": {...}}` ("parameters" is read as "arguments"), or an array
of them.

A call is announced, its id and name, as soon as its name is read and names an
offered tool; its arguments then stream as they are generated, each fragment
extending the raw arguments text, so the fragments concatenate to the final
`arguments`. Until a first call is announced the JSON is held back: if it turns out
to be no call (not JSON, a name no tool has, a plain JSON answer), it is content. A
call the output ends inside (max_tokens) is reported as cut: a complete response
lists only the calls that finished, a stream has sent what was generated.
"""

import json
import uuid
from dataclasses import dataclass

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_WS = " \t\r\n"
_ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass
class ToolCallDelta:
    """The next piece of call `index` (0, 1, ... in the order calls are announced)."""

    index: int
    arguments: str = ""  # the next fragment of the arguments text
    id: str | None = None  # id and name: on a call's first delta only, with no arguments
    name: str | None = None


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text


def fold_tool_calls(calls: list[ToolCall], deltas: list[ToolCallDelta] | None) -> None:
    """Add `deltas` to the calls they continue (or start), in place."""
    for d in deltas or []:
        if d.index == len(calls):
            calls.append(ToolCall(d.id, d.name, d.arguments))
        else:
            calls[d.index].arguments += d.arguments


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class _Value:
    """Where one JSON value ends, fed a character at a time (the text is checked by
    `json.loads` once it has ended)."""

    def __init__(self, first: str):
        self.text = first
        self.kind = "string" if first == '"' else "nested" if first in "{[" else "scalar"
        self.depth = int(self.kind == "nested")
        self.in_string = first == '"'
        self.escaped = False
        self.done = False

    def feed(self, ch: str) -> bool:
        """False: `ch` is not part of the value (a scalar ended before it)."""
        if self.kind == "scalar":
            if ch in _WS or ch in ",}]":
                self.done = True
                return False
            self.text += ch
            return True
        self.text += ch
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                self.done = self.kind == "string"
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            self.done = self.depth == 0
        return True


def _loads(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return _INVALID


_INVALID = object()


class _Call:
    def __init__(self):
        self.name: str | None = None
        self.args: _Value | None = None
        self.arguments = ""  # what the fragments add up to so far
        self.index: int | None = None  # set when announced
        self.sent = 0  # characters of `arguments` already in a delta
        self.ended = False  # the object closed
        self.complete = False

    @property
    def streamable(self) -> str:
        """The arguments text that may be sent: raw JSON grows as it arrives; a string
        (decoded) or a scalar only once it has ended."""
        if self.args is None or self.args.kind == "nested" or self.args.done:
            return self.arguments
        return ""


class _CallsReader:
    """One JSON value that should be a call object or an array of them, a character at
    a time: `feed` returns False for a character that cannot continue it."""

    def __init__(self):
        self.calls: list[_Call] = []
        self.state = "start"
        self.single = False
        self.key = ""
        self.value: _Value | None = None
        self.done = False

    def feed(self, ch: str) -> bool:
        state = self.state
        if state == "value":
            if self.value.feed(ch):
                if self.key in _ARGUMENT_KEYS and self.value is self.calls[-1].args:
                    self.calls[-1].arguments = self.value.text
                if self.value.done:
                    return self._end_value()
                return True
            if not self._end_value():
                return False
            state = self.state  # a scalar ended before `ch`: read `ch` after it
        if state == "key":
            if ch == '"' and self._key_closed():
                key = _loads('"' + self.key + '"')
                if not isinstance(key, str):
                    return False
                self.key, self.state = key, "colon"
            else:
                self.key += ch
            return True
        if ch in _WS:
            return True
        if state == "start":
            if ch == "{":
                self.single = True
                return self._new_call()
            if ch == "[":
                self.state = "first_element"
                return True
            return False
        if state in ("first_element", "element"):
            return self._new_call() if ch == "{" else False
        if state == "after_element":
            if ch == ",":
                self.state = "element"
                return True
            if ch == "]":
                self.done, self.state = True, "done"
                return True
            return False
        if state in ("key_or_close", "key_next"):
            if ch == '"':
                self.key, self.state = "", "key"
                return True
            if ch == "}" and state == "key_or_close":
                return self._end_call()
            return False
        if state == "colon":
            if ch == ":":
                self.state = "value_start"
                return True
            return False
        if state == "value_start":
            call = self.calls[-1]
            self.value = _Value(ch)
            if self.key == "name" and ch != '"':
                return False
            if self.key in _ARGUMENT_KEYS and call.args is None:
                call.args = self.value
                call.arguments = ch if self.value.kind == "nested" else ""
            self.state = "value"
            return True
        if state == "after_value":
            if ch == ",":
                self.state = "key_next"
                return True
            if ch == "}":
                return self._end_call()
            return False
        return False  # "done": nothing may follow inside the value

    def _key_closed(self) -> bool:
        # A quote closes the key unless an odd number of backslashes escapes it.
        return (len(self.key) - len(self.key.rstrip("\\"))) % 2 == 0

    def _new_call(self) -> bool:
        self.calls.append(_Call())
        self.state = "key_or_close"
        return True

    def _end_value(self) -> bool:
        call, value = self.calls[-1], self.value
        self.value, self.state = None, "after_value"
        if self.key == "name":
            name = _loads(value.text)
            if not isinstance(name, str):
                return False
            call.name = name
        elif value is call.args:
            if value.kind == "string":
                decoded = _loads(value.text)
                if not isinstance(decoded, str):
                    return False
                call.arguments = decoded
            else:
                call.arguments = value.text
        return True

    def _end_call(self) -> bool:
        call = self.calls[-1]
        call.ended = True
        if call.args is None:
            call.arguments = "{}"
        call.complete = call.name is not None and (
            call.args is None or call.args.kind == "string" or _loads(call.arguments) is not _INVALID)
        if self.single:
            self.done, self.state = True, "done"
        else:
            self.state = "after_element"
        return True


class ToolCallStream:
    """Splits content text into content and tool-call deltas, incrementally.

    Modes: "undecided" (only whitespace, or a prefix of `<tool_call>`, so far),
    "text" (content, watching for `<tool_call>`), "json" (inside a call's JSON:
    `hermes` says whether a `</tool_call>` follows it), "close" (after a Hermes
    call's JSON, reading `</tool_call>`), "final" (content to the end: the JSON was
    no call, or ended and only content may follow)."""

    def __init__(self, tool_names: set[str], parallel: bool):
        self.tool_names = tool_names
        self.parallel = parallel
        self.mode = "undecided"
        self.buf = ""  # undecided or text: not yet released; json: held since the JSON began
        self.hermes = False
        self.reader: _CallsReader | None = None
        self.calls: list[_Call] = []  # announced, in order
        self.after_call = False  # skip the whitespace after a `</tool_call>`

    @property
    def made_calls(self) -> bool:
        return any(c.complete for c in self.calls)

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        content, deltas = [], []
        i = 0
        while i < len(text):
            if self.mode == "json":
                i = self._feed_json(text, i, content, deltas)
                continue
            ch = text[i]
            i += 1
            if self.mode == "final":
                content.append(ch)
            elif self.mode == "close":
                self._feed_close(ch, content)
            elif self.after_call and ch in _WS:
                continue
            else:
                self.after_call = False
                self.buf += ch
                self._scan_text(content)
        return "".join(content), deltas

    def finish(self) -> tuple[str, list[int]]:
        """The held text that turned out to be content, and the announced calls that
        did not finish (the output ended inside them)."""
        content = ""
        if self.mode in ("undecided", "text"):
            content = self.buf
        elif self.mode == "json" and not self.calls:
            content = self.buf  # never became a call
        self.buf = ""
        cut = [c.index for c in self.calls if not c.complete]
        return content, cut

    def _scan_text(self, content: list[str]) -> None:
        if self.mode == "undecided":
            stripped = self.buf.lstrip()
            if not stripped or TOOL_OPEN.startswith(stripped) and stripped != TOOL_OPEN:
                return
            if stripped == TOOL_OPEN:
                self.buf = stripped  # whitespace before a first call is not content
            elif stripped[0] in "{[":
                self._start_json(hermes=False)
                self.reader.feed(stripped[0])
                return
            self.mode = "text"
        if self.buf.endswith(TOOL_OPEN):
            content.append(self.buf[:-len(TOOL_OPEN)])
            self.buf = TOOL_OPEN
            self._start_json(hermes=True)
            return
        keep = partial_suffix(self.buf, TOOL_OPEN)
        content.append(self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]

    def _start_json(self, hermes: bool) -> None:
        self.mode, self.hermes, self.reader = "json", hermes, _CallsReader()

    def _feed_json(self, text: str, i: int, content: list[str], deltas: list[ToolCallDelta]) -> int:
        """Feed the reader from text[i]; returns where it stopped."""
        reader = self.reader
        start, refused = i, False
        while i < len(text) and not reader.done:
            if not reader.feed(text[i]) or not self.calls and self._first_is_no_call():
                refused = True  # text[i] is no (more) call: it and what follows are content
                break
            i += 1
        self.buf += text[start:i]
        if not refused:
            self._announce(deltas)
            if reader.done:
                self.mode, self.buf = ("close" if self.hermes else "final"), ""
            return i
        if not self.calls:
            content.append(self.buf)  # held back, and never became a call
        self.mode, self.buf = "final", ""
        return i

    def _first_is_no_call(self) -> bool:
        """The first object has ended without naming an offered tool: a JSON answer."""
        calls = self.reader.calls
        return bool(calls) and calls[0].ended and calls[0].name not in self.tool_names

    def _announce(self, deltas: list[ToolCallDelta]) -> None:
        known = {id(c) for c in self.calls}
        for call in self.reader.calls:
            if id(call) not in known and call.name in self.tool_names and \
                    (self.parallel or not self.calls):
                call.index = len(self.calls)
                self.calls.append(call)
                deltas.append(ToolCallDelta(call.index, id=f"call_{uuid.uuid4().hex[:24]}",
                                            name=call.name))
            if call.index is None:
                continue
            fragment = call.streamable[call.sent:]
            if fragment:
                call.sent += len(fragment)
                # The announcing delta carries no arguments (as OpenAI streams a call).
                if deltas and deltas[-1].index == call.index and deltas[-1].id is None:
                    deltas[-1].arguments += fragment
                else:
                    deltas.append(ToolCallDelta(call.index, fragment))

    def _feed_close(self, ch: str, content: list[str]) -> None:
        self.buf += ch
        stripped = self.buf.lstrip()
        if stripped == TOOL_CLOSE:
            self.mode, self.buf, self.after_call = "text", "", True
        elif not TOOL_CLOSE.startswith(stripped):
            content.append(self.buf)
            self.mode, self.buf = "text", ""
