"""LoRA adapters at scales other than the merged ones: llama.cpp's per-request `lora` scales.

A load merges its adapters into the weights at their configured scales (engine.lora), so the
compiled pass costs nothing extra. A sequence asking for other scales (llama-server's
per-request `lora: [{id, scale}]`, or `POST /lora-adapters`' global ones) gets the difference
as llama.cpp's low-rank side path beside each adapted matmul:

    y = W_merged x + sum_d (asked[d] - merged[d]) * unit_d * B_d (A_d x)

with W_merged = W + sum_d merged[d] * unit_d * B_d A_d, which is W + sum_d asked[d] * unit_d *
B_d A_d: the adapters at the asked scales, to float32 rounding. Every row of a batch carries its
own sequence's offsets (`row_offsets`), so sequences with different scales share one forward;
the side path is numpy on the eager pass (Transformer.forward runs a batch with any such
chunk op by op: the same bits for the others), cheap beside the matmul it sits next to (rank r
against n_cols: two products of [T, r]).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .lora import LoraDelta


def offsets(asked: Sequence[float] | None, merged: Sequence[float]) -> tuple[float, ...] | None:
    """The scale offsets a sequence asking `asked` needs on a load merged at `merged` (one
    user scale per adapter), or None when there are none (nothing asked, or the same)."""
    if asked is None:
        return None
    if len(asked) != len(merged):
        raise ValueError(f"{len(asked)} LoRA scales for a model with {len(merged)} adapters")
    diff = tuple(float(a) - float(m) for a, m in zip(asked, merged))
    return diff if any(diff) else None


def row_offsets(per_chunk: Sequence[tuple[float, ...] | None], spans: Sequence[tuple[int, int]],
                n_adapters: int) -> np.ndarray | None:
    """float32 [T, n_adapters]: each row's scale offsets from its chunk's (spans: the chunks'
    rows), or None when no chunk has any."""
    if all(o is None for o in per_chunk):
        return None
    out = np.zeros((spans[-1][1] if spans else 0, n_adapters), np.float32)
    for o, (a, b) in zip(per_chunk, spans):
        if o is not None:
            out[a:b] = o
    return out


def add_side_path(y: np.ndarray, x: np.ndarray, deltas: list[LoraDelta],
                  rows: np.ndarray) -> None:
    """y += sum_d rows[:, d.adapter] * d.unit * B_d (A_d x), in place.
    y: float32 [T, n_rows]; x: float32 [T, n_cols]; rows: float32 [T, n_adapters]."""
    for d in deltas:
        s = rows[:, d.adapter] * np.float32(d.unit)                  # [T]
        if not s.any():
            continue
        y += s[:, None] * ((x @ d.a.T) @ d.b.T)                      # [T, r] -> [T, n_rows]
