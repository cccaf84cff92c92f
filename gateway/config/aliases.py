"""Glob aliases: an entry may answer to every name a pattern matches.

Claude Code names models like `claude-sonnet-4-6` and asks a second, small model for background
work; an entry with `aliases: ["claude-*"]` serves them all without listing each version. A name
is served by its exact alias if any entry has one, else by the first glob (in file order) that
matches it (fnmatch's `*`, `?`, `[...]`, case-sensitive), so a glob never takes a name from an
entry that lists it. Only model files answer to globs: an upstream entry's aliases are the
names it is sent, so they stay exact.
"""
from __future__ import annotations

GLOB_CHARS = frozenset("*?[")


def is_glob(alias: str) -> bool:
    return any(c in GLOB_CHARS for c in alias)
