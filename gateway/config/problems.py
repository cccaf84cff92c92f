"""Collecting a config file's problems, and saying each as `file:line: key.path: message`.

Every reading step adds to one `Problems` instead of stopping at the first; `render` sorts them
into file order with the line of the key they belong to (where the format gives lines).
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

Loc = tuple[str | int, ...]  # a key path: ("models", 1, "aliases")


class ConfigError(Exception):
    """The config file is invalid; `errors` lists every problem, one line each."""

    def __init__(self, source: str, errors: list[str], *, heading: str | None = None):
        """`heading` replaces "invalid config SOURCE" where the source is no file (the command
        line, a models folder), so the message names what it is."""
        self.source = source
        self.errors = errors
        count = f"{len(errors)} problem" + ("s" if len(errors) != 1 else "")
        listed = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"{heading or f'invalid config {source}'} ({count}):\n{listed}")


class Problems:
    """Problems and warnings found so far, each with the key path it belongs to."""

    def __init__(self) -> None:
        self.items: list[tuple[Loc, str]] = []
        self.warnings: list[tuple[Loc, str]] = []
        self.settled: set[Loc] = set()  # reported at the source: later complaints are noise

    def add(self, loc: Loc, message: str, *, settle: bool = False) -> None:
        if not any(loc[:n] in self.settled for n in range(len(loc) + 1)):
            self.items.append((loc, message))
        if settle:
            self.settled.add(loc)

    def warn(self, loc: Loc, message: str) -> None:
        self.warnings.append((loc, message))

    def absorb(self, other: Problems) -> None:
        """Take `other`'s problems as ours (a ${VAR:-default}'s, once the default is used)."""
        self.items += other.items
        self.settled |= other.settled


def pydantic_message(err: Mapping[str, Any], known: Iterable[str], *, secret: bool = False) -> str:
    """pydantic's error, said the way a config file's author needs it; a `secret` value's
    input is never shown (gateway/config/secrets.py)."""
    kind = err["type"]
    if kind == "extra_forbidden":
        return unknown_key(str(err["loc"][-1]), known)
    if kind == "missing":
        return "required"
    if kind in ("model_type", "dict_type"):
        return "must be a mapping of keys"
    message: str = err["msg"]
    if secret:
        return f"{message.removeprefix('Value error, ')} (a secret: its value is not shown)"
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    shown = repr(err.get("input"))
    return f"{message} (got {shown if len(shown) <= 60 else shown[:57] + '...'})"


def unknown_key(key: str, known: Iterable[str]) -> str:
    """`known` are the keys a file may hold there (see schema.file_keys)."""
    public = list(known)
    close = difflib.get_close_matches(str(key), public, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(public)})"
    return "unknown key" + hint


def dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc)


def render(items: list[tuple[Loc, str]], lines: dict[Loc, int], shown: str) -> list[str]:
    """`file:line: key.path: message`, in file order where lines are known."""
    def line_of(loc: Loc) -> int | None:
        while True:
            if loc in lines:
                return lines[loc]
            if not loc:
                return None
            loc = loc[:-1]

    rendered = []
    for loc, message in items:
        line = line_of(loc)
        where = f"{shown}:{line}" if line else shown
        rendered.append((line is None, line or 0, f"{where}: {dotted(loc)}: {message}" if loc
                         else f"{where}: {message}"))
    return [text for *_, text in sorted(rendered, key=lambda r: r[:2])]
