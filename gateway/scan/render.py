"""Config entries for found models, and a whole config written as YAML, TOML or JSON.

YAML and TOML entries carry a comment line above them (architecture, parameters, quantization,
chat template); values are written so that the config's `${VAR}` expansion leaves them as found.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.config import ModelEntry
from gateway.scan.judge import FoundModel

HEADER = ("Written by `modelyard scan`. Edit freely: `modelyard scan DIR --update FILE` "
          "keeps your edits and adds new models.")


@dataclass(frozen=True)
class Entry:
    """One `models` item as written: its fields (in order) and the comment above it."""

    fields: dict[str, Any]
    comment: str | None = None


DEFAULT_N_CTX: int = ModelEntry.model_fields["n_ctx"].default


def build_entries(models: Sequence[FoundModel], aliases: Sequence[list[str]],
                  relative_to: Path | None, default_n_ctx: int = DEFAULT_N_CTX) -> list[Entry]:
    """Config entries; paths relative to the folder `relative_to` (absolute when None)."""
    entries = []
    for m, names in zip(models, aliases):
        if relative_to is None:
            shown = m.path.absolute().as_posix()
        else:
            shown = Path(os.path.relpath(m.path.absolute(), relative_to.absolute())).as_posix()
        fields = {"model": _literal(shown), "aliases": [_literal(a) for a in names],
                  "n_ctx": min(default_n_ctx, m.n_ctx_train)}
        if m.mmproj is not None:
            proj = (m.mmproj.absolute().as_posix() if relative_to is None else Path(
                os.path.relpath(m.mmproj.absolute(), relative_to.absolute())).as_posix())
            fields["mmproj"] = _literal(proj)
        entries.append(Entry(fields, m.summary()))
    return entries


def _literal(text: str) -> str:
    """The config expands ${VAR} in every string; `$${` keeps a file name's `${` as it is."""
    return text.replace("${", "$${")


def render(fmt: str, entries: Sequence[Entry], top: dict[str, Any] | None = None,
           header: str | None = HEADER) -> str:
    """A whole config: `top`'s keys (an existing config's, when rewriting one), then `models`."""
    top = {k: v for k, v in (top or {}).items() if k != "models"}
    if fmt == "json":
        return json.dumps({**top, "models": [e.fields for e in entries]}, indent=2,
                          ensure_ascii=False) + "\n"
    lines = [f"# {header}", ""] if header else []
    if fmt == "yaml":
        if top:
            lines += [yaml.safe_dump(top, sort_keys=False, allow_unicode=True,
                                     width=2**31 - 1).rstrip("\n"), ""]
        lines.append("models:")
        return "\n".join(lines) + "\n" + yaml_items(entries, indent=2, blank_first=False)
    if fmt == "toml":
        head = ([f"# {header}"] if header else []) + _toml_top(top)
        items = toml_items(entries)  # each entry after a blank line
        return "\n".join(head) + "\n" + items if head else items.lstrip("\n")
    raise ValueError(f"unknown format {fmt!r}")


def yaml_items(entries: Sequence[Entry], indent: int, *, blank_first: bool = True) -> str:
    """Block sequence items, dashes at column `indent`, each after a blank line and its comment."""
    pad = " " * indent
    out = []
    for n, e in enumerate(entries):
        if n or blank_first:
            out.append("")
        if e.comment:
            out.append(f"{pad}# {_one_line(e.comment)}")
        for i, (key, value) in enumerate(e.fields.items()):
            out.append(f"{pad}{'- ' if i == 0 else '  '}{_yaml_value(key)}: {_yaml_value(value)}")
    return "\n".join(out) + "\n"


def _yaml_value(value: Any) -> str:
    dump = yaml.safe_dump([value], default_flow_style=True, allow_unicode=True, width=2**31 - 1)
    return dump.strip()[1:-1]  # "[x]" -> "x": one flow item is a valid block value too


def toml_items(entries: Sequence[Entry]) -> str:
    out = []
    for e in entries:
        out.append("")
        if e.comment:
            out.append(f"# {_one_line(e.comment)}")
        out.append("[[models]]")
        out += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in e.fields.items()]
    return "\n".join(out) + "\n"


def _toml_top(top: dict[str, Any]) -> list[str]:
    """Top-level keys as TOML: plain values first, then one [table] per mapping."""
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in top.items()
             if not isinstance(v, dict)]
    for key, value in top.items():
        if isinstance(value, dict):
            lines += ["", f"[{_toml_key(key)}]"]
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()]
    return lines


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise ValueError(f"TOML cannot hold {value!r} ({type(value).__name__})")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r",
                 "\b": "\\b", "\f": "\\f"}


def _toml_string(text: str) -> str:
    def escape(c: str) -> str:
        if c in _TOML_ESCAPES:
            return _TOML_ESCAPES[c]
        if ord(c) < 0x20 or ord(c) == 0x7F:
            return f"\\u{ord(c):04x}"
        return c

    return '"' + "".join(escape(c) for c in text) + '"'


def _one_line(text: str) -> str:
    return " ".join(text.split())
