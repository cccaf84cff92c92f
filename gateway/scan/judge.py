"""Judging one model file (every part, for a split model) from its GGUF headers alone.

    parts -> magic? -> read every header -> whole language model? -> the engine's judgement
    -> FoundModel (what the config entry says about it) | Skipped (the reason, for stderr)

The weights are never read; odd metadata ends in a Skipped, never an exception.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from engine.chat_formats import guess_format
from engine.gguf import MAGIC, ModelLoadError, TensorInfo, read_header
from engine.pooling import model_role
from engine.servable import judge_header


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
    mmproj: Path | None = None        # its vision projector (pairing.py), beside it
    role: str = "generation"          # or embedding, rerank (engine.pooling.model_role)

    def summary(self) -> str:
        """The comment written above the entry."""
        parts = f", split in {self.n_parts} parts" if self.n_parts > 1 else ""
        template = "yes" if self.has_chat_template else f"no (built-in {self.builtin_template!r})"
        images = f", images: {self.mmproj.name}" if self.mmproj is not None else ""
        if self.role != "generation":  # no chat: what it serves instead
            serves = "/v1/rerank" if self.role == "rerank" else "/v1/embeddings"
            return (f"{self.arch}, {format_count(self.n_params)} params, {self.quantization}"
                    f"{parts}, {self.role} model ({serves})")
        return (f"{self.arch}, {format_count(self.n_params)} params, {self.quantization}"
                f"{parts}, chat template: {template}{images}")


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


NOT_GGUF = "not a GGUF file"
MMPROJ = "a vision projector (mmproj), not a language model"  # pairing.py pairs these


def examine_parts(parts: list[Path], stem: str) -> FoundModel | Skipped:
    """Read the header of a model file (of every part, for a split model) and judge it."""
    try:
        return _judge(parts, stem)
    except Exception as e:  # noqa: BLE001 - odd metadata values the checks did not foresee: skip
        return Skipped(parts[0], f"cannot make sense of its header ({type(e).__name__}: {e})")


def _judge(parts: list[Path], stem: str) -> FoundModel | Skipped:
    first = parts[0]
    if "mmproj" in first.name.lower():
        return Skipped(first, MMPROJ)
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
        role=model_role(meta, hp.arch, hp.spec.is_encoder),
    )


def _not_servable(meta: dict[str, Any], headers: list[tuple[dict[str, Any], dict[str, TensorInfo]]],
                  parts: list[Path]) -> str | None:
    """Why this file is not a whole language model, or None (its hyperparameters are judged
    after)."""
    kind = meta.get("general.type")
    if kind == "mmproj" or any(k.startswith("clip.") for k in meta):
        return MMPROJ
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
