"""Finding model files under a folder: walk, pass over the odd ones, group split parts.

    walk DIR (hidden passed over) -> regular files, each real file once -> singles | split groups
    -> a split group with every part, or Skipped -> judge.examine_parts
    -> pairing.pair_projectors (an mmproj beside its model) -> ScanResult
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.gguf import SPLIT_NAME
from gateway.scan.judge import FoundModel, Skipped, examine_parts
from gateway.scan.pairing import pair_projectors


@dataclass
class ScanResult:
    found: list[FoundModel]
    skipped: list[Skipped]


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
        judge(examine_parts([path], path.name[:-5] if path.suffix.lower() == ".gguf" else path.name))
    for (_, prefix, count), parts in splits.items():
        missing = [n for n in range(1, count + 1) if n not in parts]
        stray = sorted(n for n in parts if not 1 <= n <= count)
        if missing or stray:
            first = parts[min(parts)]
            problem = (f"part{'s' if len(missing) > 1 else ''} {_list(missing)} of {count} "
                       "missing" if missing else f"part {_list(stray)} beyond {count} parts")
            skipped.append(Skipped(first, f"split model {prefix}: {problem}"))
            continue
        judge(examine_parts([parts[n] for n in range(1, count + 1)], prefix))

    found, skipped = pair_projectors(found, skipped)
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
        return examine_parts(parts, match["prefix"])
    if not path.is_file():
        return Skipped(path, "no such file")
    return examine_parts([path], path.name[:-5] if path.suffix.lower() == ".gguf" else path.name)


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


def _list(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers)
