"""The accuracy rule for kernels whose rounding differs from llama.cpp's: distance to an exact
evaluation.

A kernel may sum in another order than llama.cpp (whole blocks in integers, 16 interleaved rows)
and still be as accurate: both are roundings of the same exact function. So both engines' logits
are measured against the float64 evaluation of the same dequantized weights
(tests/support/reference_model.py: no 8-bit activations, no f16 KV cache), on the prompts of
llama.cpp's stored references (tests/data/smollm2, tests/data/gemma3):

    distance = mean over rows t and llama.cpp's top-32 ids j of |logit[t, j] - exact[t, j]|

llama.cpp's side is its stored top-32 logits; ours is our logits read at the same ids, so both
are averaged over the same entries. `last` is the same over the whole vocabulary of the last row
(llama.cpp stores that row whole).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.support.reference_model import ReferenceModel


@dataclass(frozen=True)
class Distance:
    top32: float  # mean |logit - exact| over every row's llama.cpp top-32 ids
    last: float   # mean |logit - exact| over the last row's whole vocabulary


@dataclass(frozen=True)
class PromptDistances:
    name: str
    n_tokens: int
    ours: Distance
    llama: Distance


def prompt_names(refs: Path) -> list[str]:
    with np.load(refs / "logits_top32.npz") as ref:
        return sorted({k[:-len("_ids")] for k in ref.files if k.endswith("_ids")
                       and not k.endswith("_top_ids")})


def measure(exact: ReferenceModel, refs: Path, ours: Callable[[list[int]], np.ndarray],
            names: list[str] | None = None) -> list[PromptDistances]:
    """ours(ids) -> float [T, n_vocab], evaluated in a fresh context."""
    out = []
    with np.load(refs / "logits_top32.npz") as ref:
        for name in names or prompt_names(refs):
            ids = ref[f"{name}_ids"].tolist()
            top_ids, top_logits = ref[f"{name}_top_ids"], ref[f"{name}_top_logits"]  # [T, 32]
            last = ref[f"{name}_last_logits"]                                        # [n_vocab]
            x = exact.logits(ids)                                                    # [T, n_vocab]
            at = np.take_along_axis(x, top_ids, axis=1)
            o = np.asarray(ours(ids), np.float64)
            o_at = np.take_along_axis(o, top_ids, axis=1)
            out.append(PromptDistances(
                name, len(ids),
                Distance(float(np.abs(o_at - at).mean()), float(np.abs(o[-1] - x[-1]).mean())),
                Distance(float(np.abs(top_logits - at).mean()), float(np.abs(last - x[-1]).mean()))))
    return out


def pooled(rows: list[PromptDistances]) -> tuple[Distance, Distance]:
    """Every prompt's distances weighted by its entries (top32: rows x 32; last: one row each)."""
    n = sum(r.n_tokens for r in rows)

    def pool(side: str) -> Distance:
        ds = [getattr(r, side) for r in rows]
        return Distance(sum(d.top32 * r.n_tokens for d, r in zip(ds, rows)) / n,
                        sum(d.last for d in ds) / len(ds))

    return pool("ours"), pool("llama")
