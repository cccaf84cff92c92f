"""The `modelyard scan` command: arguments, the run, the reports on stderr, atomic writing."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from gateway.config import ConfigError, load_config
from gateway.config.formats import FORMATS
from gateway.scan.discover import scan_dir
from gateway.scan.judge import NOT_GGUF, Skipped
from gateway.scan.naming import assign_aliases
from gateway.scan.render import DEFAULT_N_CTX, build_entries, render
from gateway.scan.update import ScanError, read_existing, updated_text

SUFFIX = {"yaml": ".yaml", "toml": ".toml", "json": ".json"}

EXIT_OK = 0
EXIT_NOTHING = 1   # no model found: nothing written (a config needs at least one model)
EXIT_USAGE = 2     # bad arguments, unreadable existing config


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
    existing = read_existing(target) if args.update and target else None

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
            raise ScanError(f"the config written would not load, so nothing was written:\n{e}") from e
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
