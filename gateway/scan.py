"""`modelyard scan`: write a config serving every GGUF model under a folder, from headers alone.

    modelyard scan DIR [-o FILE] [--format yaml|toml|json] [--force]
    modelyard scan DIR --update FILE

    walk DIR -> group split parts -> read headers (never weights) -> Found | Skipped (reason)
    -> name them (unique aliases) -> render YAML/TOML/JSON -> check with load_config -> write

A written config loads with `load_config` as it is: model paths are relative to the output file
(absolute on stdout), every entry has aliases and an `n_ctx` no larger than the model was trained
for, and YAML/TOML entries carry a comment line (architecture, parameters, quantization, chat
template). Files that cannot be served (not GGUF, truncated, vision projectors, adapters,
architectures the engine lacks) are skipped with their reason on stderr.

`--update FILE` keeps FILE's text as the user left it and adds only models it does not list yet
(compared by resolved path), with aliases unique against the ones it has. YAML and TOML entries
are appended to the text; when that is impossible (e.g. `models = [...]` written inline) the file
is rewritten from its values, comments lost, after saving the old text as FILE.bak.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import re
import stat
import sys
import tempfile
import tomllib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from gguf import LlamaFileType

from engine.gguf import MAGIC, SPLIT_NAME, ModelLoadError, TensorInfo, read_header
from engine.chat_formats import guess_format
from engine.servable import judge_header

from .config import ConfigError, ModelEntry, load_config

FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
SUFFIX = {"yaml": ".yaml", "toml": ".toml", "json": ".json"}

EXIT_OK = 0
EXIT_NOTHING = 1   # no model found: nothing written (a config needs at least one model)
EXIT_USAGE = 2     # bad arguments, unreadable existing config

HEADER = ("Written by `modelyard scan`. Edit freely: `modelyard scan DIR --update FILE` "
          "keeps your edits and adds new models.")


class ScanError(Exception):
    """A problem with the arguments or the existing config: said to the user, exit status 2."""


# ---------------------------------------------------------------------------------------------
# Finding models

@dataclass(frozen=True)
class FoundModel:
    """A servable model file, described from its GGUF header(s)."""

    path: Path              # as found under DIR; the first part of a split model
    stem: str               # file name without .gguf and without -0000N-of-0000M
    name: str | None        # general.name
    arch: str
    n_params: int           # over every part
    quantization: str       # "Q4_K_M", or the type holding most weight bytes
    n_ctx_train: int
    has_chat_template: bool
    n_parts: int = 1
    builtin_template: str = "chatml"  # the built-in served when the file has no template

    def summary(self) -> str:
        """The comment written above the entry."""
        parts = f", split in {self.n_parts} parts" if self.n_parts > 1 else ""
        template = "yes" if self.has_chat_template else f"no (built-in {self.builtin_template!r})"
        return (f"{self.arch}, {format_count(self.n_params)} params, {self.quantization}"
                f"{parts}, chat template: {template}")


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


@dataclass
class ScanResult:
    found: list[FoundModel]
    skipped: list[Skipped]


NOT_GGUF = "not a GGUF file"


def scan_dir(root: str | os.PathLike[str], *, exclude: Iterable[Path] = ()) -> ScanResult:
    """Every GGUF model under `root` (recursively; hidden files and folders are passed over).

    `exclude` names files to pass over silently (the config being written). Never raises for a
    bad file: each one ends up in `skipped` with its reason.
    """
    root = Path(root)
    excluded = {p.resolve() for p in exclude}
    found: list[FoundModel] = []
    skipped: list[Skipped] = []
    singles: list[Path] = []
    splits: dict[tuple[Path, str, int], dict[int, Path]] = {}

    for path in _unique_files(root, excluded, skipped):
        match = SPLIT_NAME.match(path.name)
        if match and int(match["count"]) > 1:
            key = (path.parent, match["prefix"], int(match["count"]))
            splits.setdefault(key, {})[int(match["no"])] = path
        else:
            singles.append(path)

    def judge(result: FoundModel | Skipped) -> None:
        if isinstance(result, FoundModel):
            found.append(result)
        else:
            skipped.append(result)

    for path in singles:
        judge(_examine([path], path.name[:-5] if path.suffix.lower() == ".gguf" else path.name))
    for (_, prefix, count), parts in splits.items():
        missing = [n for n in range(1, count + 1) if n not in parts]
        stray = sorted(n for n in parts if not 1 <= n <= count)
        if missing or stray:
            first = parts[min(parts)]
            problem = (f"part{'s' if len(missing) > 1 else ''} {_list(missing)} of {count} "
                       "missing" if missing else f"part {_list(stray)} beyond {count} parts")
            skipped.append(Skipped(first, f"split model {prefix}: {problem}"))
            continue
        judge(_examine([parts[n] for n in range(1, count + 1)], prefix))

    found.sort(key=lambda m: str(m.path))
    skipped.sort(key=lambda s: str(s.path))
    return ScanResult(found, skipped)


def _unique_files(root: Path, excluded: set[Path], skipped: list[Skipped]) -> list[Path]:
    """Regular files under root, each real file once (a symlink named .gguf wins over its blob)."""
    by_target: dict[Path, Path] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(folder) / name
            if name.startswith("."):
                continue
            if (odd := _not_a_file(path)) is not None:
                skipped.append(Skipped(path, odd))
                continue
            target = path.resolve()
            if target in excluded:
                continue
            seen = by_target.get(target)
            if seen is None:
                by_target[target] = path
                continue
            keep, drop = ((path, seen) if path.suffix.lower() == ".gguf"
                          and seen.suffix.lower() != ".gguf" else (seen, path))
            by_target[target] = keep
            skipped.append(Skipped(drop, f"the same file as {keep}"))
    return sorted(by_target.values(), key=str)


def examine_file(path: str | os.PathLike[str]) -> FoundModel | Skipped:
    """One model file named by the user (the first part, for a split model), judged as a scan
    judges the files it finds."""
    path = Path(path)
    match = SPLIT_NAME.match(path.name)
    if match and int(match["count"]) > 1:
        count = int(match["count"])
        parts = [path.with_name(f"{match['prefix']}-{i:05d}-of-{count:05d}{match['suffix']}")
                 for i in range(1, count + 1)]
        if int(match["no"]) != 1:
            return Skipped(path, f"part {int(match['no'])} of a split model: name its first part")
        missing = [str(i + 1) for i, p in enumerate(parts) if not p.is_file()]
        if missing:
            return Skipped(path, f"split model {match['prefix']}: parts {', '.join(missing)} of "
                                 f"{count} missing")
        return _examine(parts, match["prefix"])
    if not path.is_file():
        return Skipped(path, "no such file")
    return _examine([path], path.name[:-5] if path.suffix.lower() == ".gguf" else path.name)


def _not_a_file(path: Path) -> str | None:
    """Why `path` is not a regular file a model could be read from (None when it is one).
    Said out loud: a symlink loop or a FIFO looks like a file in a listing, and a FIFO would
    block whoever opens it."""
    try:
        info = path.stat()
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink loop (it never reaches a file)"
        if path.is_symlink():
            return "a dangling symlink (its target does not exist)"
        return f"cannot read: {e.strerror}"
    if stat.S_ISREG(info.st_mode):
        return None
    if stat.S_ISFIFO(info.st_mode):
        return "a FIFO (named pipe), not a file: not opened"
    if stat.S_ISSOCK(info.st_mode):
        return "a socket, not a file"
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        return "a device, not a file"
    return "not a regular file"


def _examine(parts: list[Path], stem: str) -> FoundModel | Skipped:
    """Read the header of a model file (of every part, for a split model) and judge it."""
    try:
        return _judge(parts, stem)
    except Exception as e:  # odd metadata values the checks did not foresee: skip, never crash
        return Skipped(parts[0], f"cannot make sense of its header ({type(e).__name__}: {e})")


def _judge(parts: list[Path], stem: str) -> FoundModel | Skipped:
    first = parts[0]
    if "mmproj" in first.name.lower():
        return Skipped(first, "a vision projector (mmproj), not a language model")
    try:
        with open(first, "rb") as f:
            magic = f.read(len(MAGIC))
    except OSError as e:
        return Skipped(first, f"cannot read: {e.strerror}")
    if magic != MAGIC:
        return Skipped(first, NOT_GGUF + (" (despite its name)"
                                          if first.suffix.lower() == ".gguf" else ""))

    headers: list[tuple[dict[str, Any], dict[str, TensorInfo]]] = []
    for no, part in enumerate(parts, start=1):
        try:
            headers.append(read_header(part))
        except ModelLoadError as e:
            where = f"part {no} of {len(parts)}: " if len(parts) > 1 else ""
            return Skipped(first, where + e.problem)

    meta = headers[0][0]
    problem = _not_servable(meta, headers, parts)
    if problem:
        return Skipped(first, problem)
    every_part = {name: t for _, ts in headers for name, t in ts.items()}
    try:  # the engine's own judgement, as config checks and loads make it
        hp = judge_header(first, meta, every_part)
    except ModelLoadError as e:  # an architecture, tensor type or tensor the engine lacks
        return Skipped(first, e.problem)
    tensors = list(every_part.values())
    name = meta.get("general.name")
    return FoundModel(
        path=first,
        stem=stem,
        name=name.strip() if isinstance(name, str) and name.strip() else None,
        arch=hp.arch,
        n_params=sum(t.n_elements for t in tensors),
        quantization=quantization(meta.get("general.file_type"), tensors),
        n_ctx_train=hp.n_ctx_train,
        has_chat_template=isinstance(meta.get("tokenizer.chat_template"), str),
        builtin_template=guess_format(hp.arch, meta.get("tokenizer.ggml.tokens") or ())[0],
        n_parts=len(parts),
    )


def _not_servable(meta: dict[str, Any], headers: list[tuple[dict[str, Any], dict[str, TensorInfo]]],
                  parts: list[Path]) -> str | None:
    """Why this file is not a whole language model, or None (its hyperparameters are judged
    after)."""
    kind = meta.get("general.type")
    if kind == "mmproj" or any(k.startswith("clip.") for k in meta):
        return "a vision projector (mmproj), not a language model"
    if kind == "adapter":
        return "a LoRA adapter, not a model"
    count = meta.get("split.count", 1)
    if len(parts) == 1 and isinstance(count, int) and count > 1:
        return (f"part {_part_no(meta)} of a {count}-part split model whose file name does not "
                "end in -0000N-of-0000M.gguf; rename the parts to that pattern")
    if len(parts) > 1:
        for no, (part_meta, _) in enumerate(headers):
            if part_meta.get("split.count") != len(parts) or part_meta.get("split.no") != no:
                return (f"part {no + 1} of {len(parts)} says it is part {_part_no(part_meta)} of "
                        f"{part_meta.get('split.count', '?')}: the parts do not belong together")
        expected = meta.get("split.tensors.count")
        n_tensors = sum(len(ts) for _, ts in headers)
        if isinstance(expected, int) and expected != n_tensors:
            return f"the parts hold {n_tensors} tensors, the first part announces {expected}"
    if not headers[0][1]:
        return "no tensors (a vocabulary-only file?)"
    return None


def _part_no(meta: dict[str, Any]) -> str:
    no = meta.get("split.no")  # 0-based in the file
    return str(no + 1) if isinstance(no, int) else "?"


def quantization(file_type: Any, tensors: Sequence[TensorInfo]) -> str:
    """general.file_type's name when the tensors agree with it, else their dominant type.

    Writers do not always set general.file_type right, so it is trusted only if a weight matrix
    has its base type (Q4_K for Q4_K_M).
    """
    by_bytes: Counter[str] = Counter()
    for t in tensors:
        if len(t.shape) >= 2:
            by_bytes[t.qtype.name] += t.n_bytes
    declared = None
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            declared = LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            declared = None
    if declared and any(declared == t or declared.startswith(t + "_") for t in by_bytes):
        return declared
    return by_bytes.most_common(1)[0][0] if by_bytes else "unknown"


def format_count(n: int) -> str:
    """135M, 1.24B, 57.3K: three significant digits in the largest unit that keeps it below 1000."""
    units = (("", 1), ("K", 10**3), ("M", 10**6), ("B", 10**9), ("T", 10**12))
    for i, (unit, size) in enumerate(units):
        shown = f"{n / size:.3g}"
        if float(shown) < 1000 or i == len(units) - 1:
            return shown + unit
    raise AssertionError("unreachable")


def _list(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers)


# ---------------------------------------------------------------------------------------------
# Naming

_QUANT_SUFFIX = re.compile(r"[-._ ](?:i?q\d[a-z0-9_]*|bf16|fp16|fp32|f16|f32)$", re.I)


def clean_name(text: str) -> str:
    """'SmolLM2-135M-Instruct.Q4_K_M' -> 'smollm2-135m-instruct': lowercase, dashes, no quant."""
    text = _QUANT_SUFFIX.sub("", text.strip())
    text = re.sub(r"[^a-z0-9.]+", "-", text.lower())
    return text.strip("-.")


# File names that say nothing about the model: llama.cpp's default output, blobs named by hash.
_UNINFORMATIVE = re.compile(r"(ggml-)?model(-\d+)?|(sha256-)?[0-9a-f]{16,}|[^a-z]*")


def preferred_name(m: FoundModel) -> str:
    """The clean file name, unless it says nothing (model.gguf, a hash): then general.name.

    The file name comes first because people choose it to tell their files apart, while
    general.name is often the training run's folder: SmolLM2-135M-Instruct.Q4_1.gguf calls
    itself 'Smollm2 135M 8k Lc100K Mix1 Ep2'.
    """
    from_stem = clean_name(m.stem)
    if from_stem and not _UNINFORMATIVE.fullmatch(from_stem):
        return from_stem
    return clean_name(m.name or "") or from_stem or "model"


_SIZE_PART = re.compile(r"\d+(?:\.\d+)?[kmbt]|\d+x\d+(?:\.\d+)?[mb]")


def family_name(clean: str) -> str | None:
    """'smollm2-135m-instruct' -> 'smollm2': the clean name's words before its size, if it has
    one ('gemma-3-270m' -> 'gemma-3'); None when the name says no size."""
    words = clean.split("-")
    for i, word in enumerate(words):
        if _SIZE_PART.fullmatch(word):
            return "-".join(words[:i]) or None
    return None


def assign_aliases(models: Sequence[FoundModel], taken: Iterable[str] = ()) -> list[list[str]]:
    """For each model: its family's short name when only it has that family, a clean name, then
    its file stem; unique (ignoring case) across all.

    The short name is what people type (`smollm2` for SmolLM2-135M-Instruct.Q4_1.gguf); two
    models of one family (135M and 360M, or two quantizations) both go without it. Clean names
    are given next, so one model's stem never takes another model's name. A clean name already
    in use gets the quantization appended, then a counter; a stem in use is dropped.
    """
    used = {a.casefold() for a in taken}
    bases = [preferred_name(m) for m in models]
    families = [family_name(b) for b in bases]
    family_count = Counter(f.casefold() for f in families if f)
    everyone = {n.casefold() for m, b in zip(models, bases) for n in (b, m.stem)}
    shorts: list[str | None] = []
    for family in families:
        free = (family is not None and family_count[family.casefold()] == 1
                and family.casefold() not in used and family.casefold() not in everyone)
        shorts.append(family if free else None)
        if free:
            used.add(family.casefold())  # type: ignore[union-attr]
    names: list[str] = []
    for m, base in zip(models, bases):
        quant = m.quantization.lower()
        candidates = [base] if base.endswith(quant) else [base, f"{base}-{quant}"]
        name = next((c for c in candidates if c.casefold() not in used), None)
        n = 2
        while name is None:
            numbered = f"{candidates[-1]}-{n}"
            name = numbered if numbered.casefold() not in used else None
            n += 1
        used.add(name.casefold())
        names.append(name)
    aliases = []
    for m, short, name in zip(models, shorts, names):
        stem_free = m.stem.strip() and m.stem.casefold() not in used
        aliases.append(([short] if short else []) + ([name, m.stem] if stem_free else [name]))
        used.add(m.stem.casefold())
    return aliases


# ---------------------------------------------------------------------------------------------
# Entries and rendering

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


# ---------------------------------------------------------------------------------------------
# Updating an existing config

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
    if fmt == "yaml":
        return yaml.safe_load(text)
    if fmt == "toml":
        return tomllib.loads(text)
    return json.loads(text)


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
    except (yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ScanError(f"{path}: cannot parse it as {fmt.upper()}: {e}") from None
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
    except (yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError):
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


# ---------------------------------------------------------------------------------------------
# Writing

def _check_loads(text: str, fmt: str, folder: Path) -> None:
    """load_config the text as if it lay in `folder`; raises ConfigError."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".modelyard-scan-", suffix=SUFFIX[fmt])
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        load_config(tmp)
    finally:
        os.unlink(tmp)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------------------------
# Command line

def add_scan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, metavar="DIR", help="folder to search for GGUF models")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE",
                        help="config to write (.yaml, .yml, .toml or .json); default: stdout, "
                             "with absolute model paths")
    parser.add_argument("--format", choices=["yaml", "toml", "json"],
                        help="default: from FILE's suffix, yaml on stdout")
    parser.add_argument("--update", type=Path, metavar="FILE",
                        help="add models FILE does not list yet, keeping its text and your edits")
    parser.add_argument("--force", action="store_true", help="overwrite an existing -o FILE")


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Write a modelyard config serving every GGUF model in a folder; "
                               "the model files' headers are read, never their weights.")
    add_scan_arguments(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return run_scan(_parser(prog).parse_args(argv))


def run_scan(args: argparse.Namespace) -> int:
    """Run the scan the arguments ask for: the config on stdout (or to FILE), reports on stderr."""
    try:
        return _run(args)
    except ScanError as e:
        _say(f"modelyard scan: {e}")
        return EXIT_USAGE
    except OSError as e:  # the output folder is not writable, the disk is full, ...
        _say(f"modelyard scan: cannot write: {e}")
        return EXIT_USAGE


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    root: Path = args.dir
    if not root.is_dir():
        raise ScanError(f"{root}: not a folder")
    target, fmt = _target_and_format(args)
    existing = read_existing(target) if args.update else None

    result = scan_dir(root, exclude=[target] if target else [])
    for line in _skip_lines(result.skipped, root):
        _say(line)
    found = result.found
    if existing:
        known = [m for m in found if m.path.resolve() in existing.model_files]
        found = [m for m in found if m.path.resolve() not in existing.model_files]
        if known:
            _say(f"{len(known)} model{'s' if len(known) != 1 else ''} already in {target}")
    if not found:
        if existing:
            _say(f"no new models under {root}; {target} is unchanged")
            return EXIT_OK
        _say(f"no servable GGUF model under {root}; nothing written")
        return EXIT_NOTHING

    aliases = assign_aliases(found, existing.aliases if existing else ())
    folder = target.parent if target else None
    n_ctx = existing.default_n_ctx() if existing else DEFAULT_N_CTX
    entries = build_entries(found, aliases, folder, n_ctx)

    if existing:
        text, kept = updated_text(existing, entries)
    else:
        text, kept = render(fmt, entries), True

    try:
        _check_loads(text, fmt, folder if folder else Path(tempfile.gettempdir()))
    except ConfigError as e:
        if existing is None or existing.problems is None:
            raise ScanError(f"the config written would not load, so nothing was written:\n{e}")
        _say(f"warning: {target} had problems before this update and still has them:\n"
            f"{existing.problems}")

    if target is None:
        sys.stdout.write(text)
    else:
        if existing and not kept:
            backup = target.with_name(target.name + ".bak")
            backup.write_text(existing.text, encoding="utf-8")
            _say(f"could not append to {target}'s text, so it was rewritten from its values "
                f"(comments are lost); the old text is in {backup}")
        _write_atomically(target, text)
    verb = "added" if existing else "wrote"
    where = f" to {target}" if existing else f" {target}" if target else " to stdout"
    _say(f"{verb}{where}: {len(found)} model{'s' if len(found) != 1 else ''} "
        f"({', '.join(a[0] for a in aliases)}); {len(result.skipped)} file"
        f"{'s' if len(result.skipped) != 1 else ''} skipped")
    return EXIT_OK


def _target_and_format(args: argparse.Namespace) -> tuple[Path | None, str]:
    """The file to write (None = stdout) and its format, checked against each other."""
    target: Path | None = args.update or args.output
    if args.update and args.output and args.output.resolve() != args.update.resolve():
        raise ScanError("--update FILE writes FILE in place; leave out -o")
    if target is None:
        return None, args.format or "yaml"
    fmt = FORMATS.get(target.suffix.lower())
    if fmt is None:
        raise ScanError(f"{target}: the name must end in {', '.join(FORMATS)} (modelyard tells "
                        "a config's format by its suffix)")
    if args.format and args.format != fmt:
        raise ScanError(f"--format {args.format} does not match {target.name}; name the file "
                        f"{target.stem}{SUFFIX[args.format]}")
    if not target.parent.is_dir():
        raise ScanError(f"{target.parent}: no such folder")
    if not args.update and target.exists() and not args.force:
        raise ScanError(f"{target} exists: use --update {target} to add new models to it, "
                        "or --force to overwrite it")
    return target, fmt


def _skip_lines(skipped: list[Skipped], root: Path, per_folder: int = 3) -> list[str]:
    """One line per skipped file; but a folder's many files not even named .gguf (a kernel
    cache, a repository's docs) take one line, so the lines that matter are not drowned."""
    unnamed: dict[Path, list[Skipped]] = {}
    lines: list[tuple[str, str]] = []
    for s in skipped:
        if s.reason == NOT_GGUF and s.path.suffix.lower() != ".gguf":
            unnamed.setdefault(s.path.parent, []).append(s)
        else:
            lines.append((str(s.path), f"skipped {_shown(s.path, root)}: {s.reason}"))
    for folder, items in unnamed.items():
        if len(items) <= per_folder:
            lines += [(str(s.path), f"skipped {_shown(s.path, root)}: {s.reason}") for s in items]
        else:
            names = ", ".join(s.path.name for s in items[:2])
            lines.append((str(items[0].path), f"skipped {len(items)} files in "
                          f"{_shown(folder, root)}/ that are not GGUF ({names}, ...)"))
    return [line for _, line in sorted(lines)]


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
