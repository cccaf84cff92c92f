"""Pairing vision projectors (mmproj files) with the models they give images to.

    projectors skipped by judge.py -> models in the same folder that the projector fits
    (engine.servable.why_not_a_pair: a supported projector type writing rows of the model's
    embedding width) -> of those, the ones whose name matches (general.name, else the file
    name, each with "mmproj" and the quantization suffix taken out) -> exactly one: paired

Names decide only among models the headers allow, so a folder of several models keeps each
projector with its own; a projector that pairs with no model (or with several equally) stays
skipped, with the reason.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from engine.gguf import read_header
from engine.servable import why_not_a_pair
from gateway.scan.judge import MMPROJ, FoundModel, Skipped
from gateway.scan.naming import clean_name


def _key(text: str) -> str:
    """A name to compare: lower case, no "mmproj", no quantization suffix, letters and digits."""
    text = re.sub(r"mmproj(?:[-_ ]model)?", "", text, flags=re.I)
    return re.sub(r"[^a-z0-9]+", "", clean_name(text.strip(" -_.")))


def _projector_name(path: Path) -> str | None:
    try:
        name = read_header(path)[0].get("general.name")
    except (OSError, ValueError):
        return None
    return name if isinstance(name, str) and name.strip() else None


def _matches(projector: Path, model: FoundModel) -> bool:
    name = _projector_name(projector)
    if name is not None and model.name is not None and _key(name) == _key(model.name):
        return True
    a, b = _key(projector.name.removesuffix(".gguf")), _key(model.stem)
    return bool(a) and bool(b) and (a.startswith(b) or b.startswith(a))


def pair_projectors(found: list[FoundModel], skipped: list[Skipped]
                    ) -> tuple[list[FoundModel], list[Skipped]]:
    """`found` with each paired projector in its model's `mmproj`; `skipped` without them."""
    by_path = {m.path: m for m in found}
    still: list[Skipped] = []
    for s in skipped:
        if not s.reason.startswith(MMPROJ):
            still.append(s)
            continue
        fits = [m for m in by_path.values() if m.path.parent == s.path.parent
                and m.mmproj is None and why_not_a_pair(m.path, s.path) is None]
        named = [m for m in fits if _matches(s.path, m)]
        if len(named) == 1:
            by_path[named[0].path] = dataclasses.replace(named[0], mmproj=s.path)
            continue
        why = ("no model in its folder that it fits" if not fits else
               "no model in its folder with a matching name" if not named else
               f"{len(named)} models in its folder match it; name it in one entry's `mmproj`")
        still.append(Skipped(s.path, f"{s.reason}; paired with {why}"))
    return [by_path[m.path] for m in found], still
