"""`${VAR}` and `${VAR:-default}` in config values, expanded before anything is checked."""
from __future__ import annotations

import os
import re
from typing import Any

from gateway.config.problems import Loc, Problems

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what may follow `${`


def expand_env(value: Any, loc: Loc, problems: Problems) -> Any:
    """Expand ${VAR} and ${VAR:-default} in every string value; `$${` writes a literal `${`.
    A default may itself hold references: ${A:-${B:-x}} is A, else B, else x."""
    if isinstance(value, dict):
        return {k: expand_env(v, loc + (k,), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, loc + (i,), problems) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value
    text, _ = _expand_text(value, 0, loc, problems, inside=False)
    return text


def _expand_text(text: str, at: int, loc: Loc, problems: Problems,
                 inside: bool) -> tuple[str, int]:
    """Expand from `at` to the end (or, `inside` a default, to its closing brace); returns the
    text and where it stopped (just past that brace)."""
    out: list[str] = []
    while at < len(text):
        if text.startswith("$${", at):
            out.append("${")
            at += 3
        elif text.startswith("${", at) and (name := ENV_NAME.match(text, at + 2)):
            end = name.end()
            default: str | None = None
            inner = Problems()  # the default's own problems count only if it is used
            if text.startswith(":-", end):
                default, end = _expand_text(text, end + 2, loc, inner, inside=True)
            elif text.startswith("}", end):
                end += 1
            else:  # not a reference after all: keep it as written
                out.append(text[at:end])
                at = end
                continue
            if not os.environ.get(name.group(0)):
                problems.absorb(inner)
            out.append(_lookup(name.group(0), default, loc, problems))
            at = end
        elif inside and text[at] == "}":
            return "".join(out), at + 1
        else:
            out.append(text[at])
            at += 1
    return "".join(out), at


def _lookup(name: str, default: str | None, loc: Loc, problems: Problems) -> str:
    found = os.environ.get(name)
    if found:  # like the shell's ${VAR:-default}: an empty variable takes the default too
        return found
    if default is not None:
        return default
    if found is not None:
        return found
    problems.add(loc, f"environment variable {name} is not set "
                      f"(write ${{{name}:-default}} to give a fallback)", settle=True)
    return ""
