"""Config file formats: YAML, TOML or JSON, told by the file's suffix. Shared by config and scan.

`parse(fmt, text)` returns the data with the line of every key (YAML gives them; TOML and JSON
give lines only for syntax errors) and the keys given twice, which YAML and JSON readers would
otherwise drop silently (the last one wins). A syntax error is a `ParseError` with its line.
"""
from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.config.problems import Loc

# libyaml's parser when PyYAML has it (same nodes and marks, a few times faster on big configs)
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}  # suffix -> format


def format_of(path: Path) -> str | None:
    """"yaml", "toml" or "json" by the file's suffix; None for any other."""
    return FORMATS.get(path.suffix.lower())


class ParseError(Exception):
    """The text is not valid `fmt`: str() says "invalid YAML: <reason>"; `line` where the parser
    says (1-based)."""

    def __init__(self, fmt: str, reason: str, line: int | None = None):
        super().__init__(f"invalid {fmt.upper()}: {reason}")
        self.reason = reason
        self.line = line


@dataclass
class Parsed:
    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)         # key path -> line
    duplicates: list[tuple[Loc, str]] = field(default_factory=list)  # where, and a message


def parse(fmt: str, text: str) -> Parsed:
    """Parse `text` as `fmt` (a value of FORMATS)."""
    readers = {"yaml": _read_yaml, "toml": _read_toml, "json": _read_json}
    return readers[fmt](text)


def _read_yaml(text: str) -> Parsed:
    loader = _YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        message = ", ".join(str(p) for p in (e.context, e.problem) if p)
        raise ParseError("yaml", message, mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise ParseError("yaml", str(e)) from None
    finally:
        loader.dispose()
    parsed = Parsed(data)
    if node is not None:
        _index_yaml(node, (), parsed)
    return parsed


def _index_yaml(node: yaml.Node, loc: Loc, parsed: Parsed) -> None:
    """Record the line of every key and item, and the keys given twice."""
    if loc:  # the document itself has no useful line
        parsed.lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key, line = key_node.value, key_node.start_mark.line + 1
            if key in first_line:
                parsed.duplicates.append((loc + (key,), f"duplicate key: given on line "
                                          f"{first_line[key]} and again on line {line}"))
                continue
            first_line[key] = line
            parsed.lines[loc + (key,)] = line
            _index_yaml(value_node, loc + (key,), parsed)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_yaml(item, loc + (i,), parsed)


def _read_toml(text: str) -> Parsed:
    try:
        return Parsed(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:
        message = str(e)
        at = re.search(r"\s*\(at line (\d+), column \d+\)$", message)
        if at:
            raise ParseError("toml", message[:at.start()], int(at.group(1))) from None
        raise ParseError("toml", message) from None


def _read_json(text: str) -> Parsed:
    duplicates: list[tuple[Loc, str]] = []

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                duplicates.append(((), f"duplicate key {key!r} in a JSON object"))
            seen[key] = value
        return seen

    try:
        return Parsed(json.loads(text, object_pairs_hook=unique_keys), duplicates=duplicates)
    except json.JSONDecodeError as e:
        raise ParseError("json", f"{e.msg} (column {e.colno})", e.lineno) from None
