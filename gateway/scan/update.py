"""`--update FILE`: add entries to an existing config, keeping its text as the user left it.

    read FILE (by suffix) -> what it lists (load_config, or its raw values if it does not load)
    -> append to the text (YAML block list, TOML [[models]]) -> parse: old values + new last?
       yes -> kept | no -> rewrite from its values (comments lost; the caller keeps FILE.bak)
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.config import ConfigError, load_config
from gateway.config.formats import FORMATS, ParseError, parse
from gateway.scan.render import DEFAULT_N_CTX, Entry, render, toml_items, yaml_items


class ScanError(Exception):
    """A problem with the arguments or the existing config: said to the user, exit status 2."""


@dataclass
class Existing:
    """A config file being updated: its text, raw values, and what it already serves."""

    path: Path
    fmt: str
    text: str
    data: dict[str, Any]
    model_files: set[Path]            # resolved
    aliases: set[str]
    problems: ConfigError | None      # load_config's complaint, if the file is not valid now

    @property
    def models(self) -> list[Any]:
        models = self.data.get("models")
        return models if isinstance(models, list) else []

    def default_n_ctx(self) -> int:
        defaults = self.data.get("defaults")
        n_ctx = defaults.get("n_ctx") if isinstance(defaults, dict) else None
        valid = isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0
        return n_ctx if valid else DEFAULT_N_CTX  # type: ignore[return-value]


def parse_text(fmt: str, text: str) -> Any:
    return parse(fmt, text).data  # the reader load_config uses


def read_existing(path: Path) -> Existing:
    """Parse the config to update; a file that does not parse is a ScanError (nothing written)."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ScanError(f"{path}: cannot tell its format; the name must end in "
                        f"{', '.join(FORMATS)}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScanError(f"{path}: no such config to update (leave out --update to write a "
                        "new one)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScanError(f"{path}: cannot read: {e}") from None
    try:
        data = parse_text(fmt, text)
    except ParseError as e:
        where = f"{path}:{e.line}" if e.line else f"{path}"
        raise ScanError(f"{where}: cannot parse it as {fmt.upper()}: {e.reason}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScanError(f"{path}: the top level must be a mapping of keys")
    if "models" in data and data["models"] is not None and not isinstance(data["models"], list):
        raise ScanError(f"{path}: `models` must be a list of entries")

    try:
        config = load_config(path)
    except ConfigError as e:
        problems: ConfigError | None = e
        files, aliases = _listed_raw(data, path.resolve().parent)
    else:
        problems = None
        files = {m.model.resolve() for m in config.models}
        aliases = set(config.aliases())
    return Existing(path, fmt, text, data, files, aliases, problems)


def _listed_raw(data: dict[str, Any], base: Path) -> tuple[set[Path], set[str]]:
    """Files and aliases of a config that does not load, read from its raw values."""
    files: set[Path] = set()
    aliases: set[str] = set()
    for item in data.get("models") or []:
        if not isinstance(item, dict):
            continue
        model = item.get("model")
        if isinstance(model, str) and model.strip():
            files.add((base / Path(model).expanduser()).resolve())
        names = item.get("aliases")
        names = [names] if isinstance(names, str) else names if isinstance(names, list) else []
        aliases.update(a for a in names if isinstance(a, str))
        if isinstance(item.get("model_alias"), str):
            aliases.add(item["model_alias"])
        if "aliases" not in item and "model_alias" not in item and isinstance(model, str):
            aliases.add(model)
    return files, aliases


def updated_text(existing: Existing, entries: Sequence[Entry]) -> tuple[str, bool]:
    """The existing config with `entries` added, and whether its text was kept (else rewritten).

    Appending is verified by parsing the result: the old values unchanged, the new entries last.
    """
    appended = None
    if existing.fmt == "yaml":
        appended = _yaml_append(existing.text, entries)
    elif existing.fmt == "toml":
        appended = _toml_append(existing.text, existing.data, entries)
    if appended is not None and _adds_exactly(existing, appended, entries):
        return appended, True
    if not all(isinstance(m, dict) for m in existing.models):
        raise ScanError(f"{existing.path}: every `models` item must be a mapping; fix that first")
    rewritten = render(existing.fmt, [Entry(m) for m in existing.models] + list(entries),
                       top=existing.data, header=None)
    if not _adds_exactly(existing, rewritten, entries):
        raise ScanError(f"{existing.path}: cannot add entries to it without changing its values")
    return rewritten, existing.fmt == "json"  # JSON has no comments to lose


def _adds_exactly(existing: Existing, text: str, entries: Sequence[Entry]) -> bool:
    try:
        data = parse_text(existing.fmt, text)
    except ParseError:
        return False
    if not isinstance(data, dict):
        return False
    rest = {k: v for k, v in data.items() if k != "models"}
    old_rest = {k: v for k, v in existing.data.items() if k != "models"}
    return rest == old_rest and data.get("models") == existing.models + [e.fields for e in entries]


def _yaml_append(text: str, entries: Sequence[Entry]) -> str | None:
    """Insert items at the end of a block `models:` list; None when the text is not like that."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    if root is None:
        return _with_newline(text) + "models:\n" + yaml_items(entries, indent=2)
    if not isinstance(root, yaml.MappingNode) or root.flow_style:
        return None
    value = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode)
                  and k.value == "models"), None)
    lines = text.splitlines(keepends=True)
    if value is None:
        return _with_newline(text) + "models:\n" + yaml_items(entries, indent=2)
    if isinstance(value, yaml.ScalarNode) and value.tag == "tag:yaml.org,2002:null":
        # `models:` with nothing (or ~): drop the null, put the items on the lines after it
        key_line = value.end_mark.line
        head = text[:value.start_mark.index] + text[value.end_mark.index:]
        lines = head.splitlines(keepends=True)
        at = key_line + 1
        before = _with_newline("".join(lines[:at]))
        return before + yaml_items(entries, indent=2) + "".join(lines[at:])
    if not isinstance(value, yaml.SequenceNode) or value.flow_style or not value.value:
        return None
    # The list ends where the next top-level key begins; blank lines and column-0 comments just
    # before that belong to the next key (or to the end of the file), so insert above them.
    end = value.end_mark
    at = end.line if end.column == 0 else end.line + 1
    last_item = value.value[-1].start_mark.line + 1
    while at > last_item and (not lines[at - 1].strip() or lines[at - 1].startswith("#")):
        at -= 1
    before = _with_newline("".join(lines[:at]))
    return before + yaml_items(entries, indent=value.start_mark.column) + "".join(lines[at:])


_TOML_MODELS_TABLE = re.compile(r"^[ \t]*\[\[[ \t]*models[ \t]*\]\]", re.M)


def _toml_append(text: str, data: dict[str, Any], entries: Sequence[Entry]) -> str | None:
    """Append [[models]] tables; impossible when `models` is an inline array (None)."""
    if "models" in data and not _TOML_MODELS_TABLE.search(text):
        return None
    return _with_newline(text) + toml_items(entries)


def _with_newline(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"
