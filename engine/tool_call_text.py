"""Reading tool-call objects out of JSON text that may still be being written.

A call is `{"name": .., "arguments": {..}}` (or "parameters"). While a reply streams, the text
ends anywhere: `read_call` returns what is certain so far (the name once it is complete, the
arguments as written up to now); read again when complete, the same call has the same name and
arguments that extend what was returned before, so streamed pieces add up to the final values.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass
class CallText:
    name: str
    arguments: str        # the arguments object as the model wrote it (a prefix while streaming)
    complete: bool = False


_WS_CHARS = " \t\r\n"


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS_CHARS:
        i += 1
    return i


def value_end(text: str, i: int) -> int | None:
    """End of the JSON object or array starting at text[i], or None if it is not complete."""
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        c = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(\w+)"\s*:\s*')


def read_call(text: str, i: int, args_key: str) -> tuple[CallText | None, int]:
    """The call object at text[i] ({"name": .., args_key: {..}}), as far as it is written, and
    where it ends. Name and arguments may come in either order in a complete object."""
    end = value_end(text, i)
    if end is not None:  # complete: read it properly (any member order)
        try:
            members = _members(text, i)
        except ValueError:
            members = {}
        name = members.get("name")
        args = members.get(args_key) or members.get("arguments") or members.get("parameters")
        if name is not None and isinstance(name[0], str):
            raw = args[1] if args is not None else "{}"
            return CallText(name[0], raw, True), end
        return None, end
    m = _HEAD.match(text, i)
    if m is None or m.group(2) not in (args_key, "arguments", "parameters"):
        return None, len(text)
    args_end = value_end(text, m.end())  # the arguments may be complete before the call is
    raw = text[m.end():args_end] if args_end is not None else text[m.end():].rstrip()
    return CallText(json.loads(m.group(1)), raw), len(text)


def _members(text: str, i: int) -> dict[str, tuple[Any, str]]:
    """A complete JSON object's members: key -> (value, the value's text)."""
    decoder = json.JSONDecoder()
    out: dict[str, tuple[Any, str]] = {}
    i = skip_ws(text, i + 1)
    if text[i] == "}":
        return out
    while True:
        key, i = decoder.raw_decode(text, i)
        i = skip_ws(text, i)
        if text[i] != ":":
            raise ValueError("expected ':'")
        start = skip_ws(text, i + 1)
        value, i = decoder.raw_decode(text, start)
        out[str(key)] = (value, text[start:i])
        i = skip_ws(text, i)
        if text[i] == "}":
            return out
        if text[i] != ",":
            raise ValueError("expected ','")
        i = skip_ws(text, i + 1)


def calls_in(text: str, args_key: str) -> list[CallText]:
    """Call objects in `text` (one after another, or the items of one array)."""
    calls: list[CallText] = []
    i = 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return calls
        call, i = read_call(text, i, args_key)
        if call is not None:
            calls.append(call)


def json_string_prefix(text: str, final: bool) -> str:
    """The decoded part of the JSON string starting at text[0] ('"') that is complete."""
    if not text.startswith('"'):
        return ""
    i, escaped = 1, False
    while i < len(text):
        c = text[i]
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == '"':
            return str(json.loads(text[:i + 1]))
        i += 1
    part = text[1:]
    cut = part.rfind("\\")  # an escape that may be unfinished ("\u00" ...): leave it for later
    if cut >= 0 and len(part) - cut < 6:
        part = part[:cut]
    try:
        return str(json.loads('"' + part + '"'))
    except json.JSONDecodeError:
        return ""
