"""Naming found models: clean names, family short names, aliases unique across a config."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from gateway.scan.judge import FoundModel

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
