"""What `modelyard pull` was asked for, and which files of a repository that means.

    owner/repo                 the repository's GGUF in Q4_K_M (llama.cpp's -hf default), else
                               the only one there is; several others -> an error listing them
    owner/repo:Q8_0            the GGUF whose name has that quantization (any case)
    https://HOST/owner/repo/resolve/REV/path/file.gguf   (or .../blob/...) that file
    hf.co/owner/repo[:QUANT]   as owner/repo

A split model (`NAME-00001-of-00003.gguf`) means all its parts. With `mmproj`, the repository's
vision projector (a GGUF whose name starts with mmproj) comes too: the one of the same
quantization if there is one, else F16, BF16, Q8_0, F32 in that order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_QUANT = "Q4_K_M"
SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)
REPO = re.compile(r"^[\w.-]+/[\w.-]+$")
PROJECTOR_ORDER = ["F16", "BF16", "Q8_0", "F32"]


class PullError(Exception):
    """What cannot be pulled, and why, as one message for the user."""


@dataclass(frozen=True)
class Wanted:
    repo: str
    revision: str = "main"
    quant: str | None = None   # a tag such as Q4_K_M
    path: str | None = None    # an exact file, from a URL


def parse(spec: str) -> Wanted:
    text = spec.strip()
    if "://" in text:
        url = urlsplit(text)
        parts = [p for p in url.path.split("/") if p]
        if len(parts) >= 5 and parts[2] in ("resolve", "blob"):
            return Wanted(f"{parts[0]}/{parts[1]}", parts[3], path="/".join(parts[4:]))
        if len(parts) == 2:
            text = "/".join(parts)
        else:
            raise PullError(f"{spec}: give owner/repo[:QUANT] or a file's URL "
                            "(https://huggingface.co/OWNER/REPO/resolve/main/FILE.gguf)")
    for prefix in ("hf.co/", "huggingface.co/"):
        text = text.removeprefix(prefix)
    repo, _, quant = text.partition(":")
    if not REPO.match(repo):
        raise PullError(f"{spec}: give owner/repo[:QUANT] (such as "
                        "bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M) or a file's URL")
    return Wanted(repo, quant=quant or None)


def is_projector(path: str) -> bool:
    return path.rsplit("/", 1)[-1].lower().startswith("mmproj")


def _has_quant(path: str, quant: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", name, re.I) is not None


def _with_parts(chosen: str, files: list[str]) -> list[str]:
    """The chosen file, or every part of the split model it is a part of (in order)."""
    match = SPLIT.match(chosen.rsplit("/", 1)[-1])
    if match is None:
        return [chosen]
    folder = chosen.rsplit("/", 1)[0] + "/" if "/" in chosen else ""
    count = int(match["count"])
    parts = [f"{folder}{match['prefix']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    absent = [p for p in parts if p not in files]
    if absent:
        raise PullError(f"{chosen}: split model with parts missing from the repository: {absent}")
    return parts


def choose(wanted: Wanted, files: list[str], mmproj: bool) -> list[str]:
    """The repository files to download (`files`: every path in it), model first."""
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    models = [f for f in ggufs if not is_projector(f)]
    if wanted.path is not None:
        if wanted.path not in files:
            raise PullError(f"{wanted.repo} has no file {wanted.path} (at {wanted.revision})")
        chosen = [wanted.path]
    else:
        if not models:
            raise PullError(f"{wanted.repo} has no GGUF model file (it has: "
                            f"{', '.join(files[:12]) or 'nothing'})")
        quant = wanted.quant or DEFAULT_QUANT
        matches = [f for f in models if _has_quant(f, quant)]
        firsts = {_with_parts(f, files)[0] for f in matches}
        if not firsts and wanted.quant is None and len({_with_parts(f, files)[0] for f in models}) == 1:
            firsts = {_with_parts(models[0], files)[0]}
        if len(firsts) != 1:
            listed = ", ".join(sorted({_with_parts(f, files)[0] for f in models}))
            what = "no" if not firsts else "more than one"
            raise PullError(f"{wanted.repo} has {what} GGUF file for {quant}; pick one with "
                            f"{wanted.repo}:QUANT or its URL. Its GGUF files: {listed}")
        chosen = [firsts.pop()]
    chosen = _with_parts(chosen[0], files) if not is_projector(chosen[0]) else chosen
    if mmproj:
        chosen.append(_projector(wanted, ggufs, chosen[0]))
    return chosen


def _projector(wanted: Wanted, ggufs: list[str], model: str) -> str:
    projectors = [f for f in ggufs if is_projector(f)]
    if not projectors:
        raise PullError(f"{wanted.repo} has no vision projector (no mmproj*.gguf file)")
    quant = wanted.quant or next((q for q in (DEFAULT_QUANT, *PROJECTOR_ORDER)
                                  if _has_quant(model, q)), None)
    for q in ([quant] if quant else []) + PROJECTOR_ORDER:
        same = [p for p in projectors if _has_quant(p, q)]
        if same:
            return same[0]
    return projectors[0]
