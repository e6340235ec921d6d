"""Incremental parsing of a model's answer into content and tool calls (one sample's text, fed as
it is generated).

The parser reads its input one character at a time, so that feeding a text whole or in any pieces
gives the same joined output: the content is the text before the format's first marker (text that
could still become a marker is held back, so no call's text leaks into the content), and each call
comes as :class:`ToolCallDelta` pieces as OpenAI streams them: first its index, id and name (once
the name's JSON string is complete), then its arguments' JSON text as the model writes it, piece by
piece. A call whose arguments come before its name is given whole when its object ends. Text
between and after calls (the tags, the array's brackets) is not content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from zerolayer.common.generation import ToolCallDelta
from zerolayer.frontend.chat.tool_formats import ToolFormat

_KEY = r'"((?:[^"\\]|\\.)*)"'
_LEADING_KEY = {
    "{": re.compile(r"\s*\{\s*" + _KEY),
    "[": re.compile(r"\s*\[\s*\{\s*" + _KEY),
}
"""The first key of an answer that starts with a call object (or an array of them)."""
_LEADING_MAYBE = {
    "{": re.compile(r'\s*(\{\s*("(?:[^"\\]|\\.)*\\?)?)?'),
    "[": re.compile(r'\s*(\[\s*(\{\s*("(?:[^"\\]|\\.)*\\?)?)?)?'),
}
"""An answer that may still become one (its first key not yet whole)."""


@dataclass
class ParsedText:
    """What one piece of input gave."""

    content: str = ""
    deltas: list[ToolCallDelta] = field(default_factory=list)

    def add_delta(self, delta: ToolCallDelta) -> None:
        """Appends ``delta``, merged into the last one when it continues that call's arguments."""
        last = self.deltas[-1] if self.deltas else None
        if last is not None and last.index == delta.index and not (delta.id or delta.name):
            self.deltas[-1] = ToolCallDelta(
                last.index, last.id, last.name, last.arguments + delta.arguments
            )
        else:
            self.deltas.append(delta)


class ToolCallParser:
    """Splits one sample's answer into content and tool-call deltas (see the module docstring)."""

    def __init__(self, fmt: ToolFormat, max_calls: int | None = None) -> None:
        """Args:
        fmt: the family's format.
        max_calls: the calls kept (1: ``parallel_tool_calls`` false); later ones are dropped.
        """
        self.fmt = fmt
        self.max_calls = max_calls
        self.num_calls = 0
        """Calls begun so far."""
        self._mode = "start" if fmt.leading else "content"
        self._pending = ""
        self._object = _CallObject(fmt.arguments_key)
        self._skipping = False

    def feed(self, text: str) -> ParsedText:
        """The content and deltas ``text`` completes."""
        out = ParsedText()
        self._pending += text
        self._advance(out)
        return out

    def finish(self) -> ParsedText:
        """What is left at the end of the answer: held-back text that began no call is content;
        an unfinished call stays as far as it came."""
        out = ParsedText()
        if self._mode in ("start", "leading", "content"):
            out.content, self._pending = self._pending, ""
        return out

    def _advance(self, out: ParsedText) -> None:
        if self._mode == "start":
            stripped = self._pending.lstrip()
            if not stripped:
                return
            self._mode = "leading" if stripped.startswith(self.fmt.leading) else "content"
        if self._mode == "leading":
            first_key = _LEADING_KEY[self.fmt.leading].match(self._pending)
            if first_key:
                key = _json_string(f'"{first_key.group(1)}"')
                self._mode = "calls" if key == "name" else "content"
                if self._mode == "calls":
                    self._pending = self._pending.lstrip()
            elif not _LEADING_MAYBE[self.fmt.leading].fullmatch(self._pending):
                self._mode = "content"
            else:
                return
        if self._mode == "content":
            self._read_content(out)
        if self._mode == "calls":
            self._read_calls(self._pending, out)
            self._pending = ""

    def _read_content(self, out: ParsedText) -> None:
        found = [(self._pending.find(m), m) for m in self.fmt.markers if m in self._pending]
        if found:
            at, marker = min(found)
            out.content += self._pending[:at]
            self._pending = self._pending[at + len(marker) :]
            self._mode = "calls"
            return
        keep = _marker_prefix_length(self._pending, self.fmt.markers)
        cut = len(self._pending) - keep
        out.content += self._pending[:cut]
        self._pending = self._pending[cut:]

    def _read_calls(self, text: str, out: ParsedText) -> None:
        for char in text:
            if not self._object.open:
                if char != "{":
                    continue  # the tags, brackets and separators around the calls
                index = self.num_calls
                self.num_calls += 1
                self._skipping = self.max_calls is not None and index >= self.max_calls
                self._object = _CallObject(self.fmt.arguments_key, index, self.fmt.new_call_id())
            delta = self._object.read(char)
            if delta is not None and not self._skipping:
                out.add_delta(delta)
            if not self._object.open and not self._skipping:
                for last in self._object.close():
                    out.add_delta(last)


def _marker_prefix_length(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that begins some marker."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


class _CallObject:
    """One call's JSON object, read a character at a time: finds its top-level keys, the name's
    string and the arguments' value, and streams the arguments' text once the name is known."""

    def __init__(self, arguments_key: str, index: int = 0, call_id: str = "") -> None:
        self.arguments_key = arguments_key
        self.index = index
        self.call_id = call_id
        self.open = False
        self.text = ""
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._expect = "key"  # key, colon, value, in_value, after_value (at depth 1)
        self._key_start = 0
        self._key = ""
        self._value_start = 0
        self.name: str | None = None
        self.arguments_streamed = False
        self._streaming = False
        self._name_ready = False

    def read(self, char: str) -> ToolCallDelta | None:
        """Takes the next character; the delta it completes, if any."""
        self.text += char
        position = len(self.text) - 1
        if not self.open:
            self.open, self._depth = True, 1
            return None
        streaming = self._streaming
        if self._in_string:
            self._read_string_char(char, position)
        elif char == '"':
            self._in_string = True
            if self._depth == 1 and self._expect == "key":
                self._key_start = position
            elif self._depth == 1 and self._expect == "value":
                self._begin_value(position)
        elif char in "{[":
            if self._depth == 1 and self._expect == "value":
                self._begin_value(position)
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            if self._depth == 1 and self._expect == "in_value":
                self._end_value()
                return self._arguments_delta(char, streaming)
            if self._depth == 0:
                if self._expect == "in_value":
                    self._end_value(position)
                self.open = False
                return None
        elif self._depth == 1 and char == ":" and self._expect == "colon":
            self._expect = "value"
        elif self._depth == 1 and char == ",":
            if self._expect == "in_value":
                self._end_value(position)
            self._expect = "key"
        elif self._depth == 1 and self._expect == "value" and not char.isspace():
            self._begin_value(position)
        return self._arguments_delta(char, streaming)

    def _read_string_char(self, char: str, position: int) -> None:
        if self._escape:
            self._escape = False
        elif char == "\\":
            self._escape = True
        elif char == '"':
            self._in_string = False
            if self._depth == 1 and self._expect == "key":
                self._key = _json_string(self.text[self._key_start : position + 1])
                self._expect = "colon"
            elif self._depth == 1 and self._expect == "in_value" and self._key == "name":
                self._end_value()

    def _begin_value(self, position: int) -> None:
        self._expect = "in_value"
        self._value_start = position
        is_object = self.text[position] == "{"
        if self._key == self.arguments_key and self.name is not None and is_object:
            self._streaming = True

    def _end_value(self, end: int | None = None) -> None:
        value = self.text[self._value_start : end if end is not None else len(self.text)]
        if self._key == "name" and self.name is None:
            name = _json_string(value.strip())
            self.name = name if isinstance(name, str) else None
            self._name_ready = self.name is not None
        self._expect = "after_value"
        if self._streaming:
            self._streaming = False
            self.arguments_streamed = True

    def _arguments_delta(self, char: str, streaming: bool) -> ToolCallDelta | None:
        if self._name_ready:
            self._name_ready = False
            return ToolCallDelta(self.index, self.call_id, self.name or "")
        if streaming or self._streaming:
            return ToolCallDelta(self.index, arguments=char)
        return None

    def close(self) -> list[ToolCallDelta]:
        """The deltas left when the object ended: a call whose name or arguments could not be
        streamed is given whole (none: not a call)."""
        if self.name is not None and self.arguments_streamed:
            return []
        try:
            value = json.loads(self.text)
        except (json.JSONDecodeError, RecursionError):
            return []
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return []
        arguments = value.get(self.arguments_key, {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        first = ToolCallDelta(self.index, self.call_id, value["name"])
        deltas = [] if self.name is not None else [first]
        return [*deltas, ToolCallDelta(self.index, arguments=text)]


def _json_string(text: str) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
