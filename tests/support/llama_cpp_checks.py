"""Checks against llama.cpp's reference outputs that the synth model tests share (tests/data/
synth/ and synth3/: each manifest entry's `suggested_tolerance`, and greedy runs)."""
from __future__ import annotations

from typing import Any

import numpy as np

NEAR_TIE = 0.1  # a greedy split is allowed only where our top two logits are this close


def assert_within(ours: np.ndarray, ref: np.ndarray, tol: dict[str, Any], what: str,
                  top1_min: int | None = None) -> None:
    """[n, n_vocab] logits within a manifest tolerance: max and mean |diff|, top-1 agreement."""
    diff = np.abs(ours - ref)
    agree = int((ours.argmax(-1) == ref.argmax(-1)).sum())
    print(f"{what}: max {diff.max():.2e} mean {diff.mean():.2e} top-1 {agree}/{len(ref)}")
    assert diff.max() <= tol["max_abs"], what
    assert diff.mean() <= tol["mean_abs"], what
    assert agree >= (tol["top1_agree_min"] if top1_min is None else top1_min), what


def assert_greedy_until_a_near_tie(model: Any, ids: list[int], want: list[int]) -> None:
    """Our greedy tokens equal llama.cpp's `want`, or split from them only where our own logits
    on llama.cpp's path put its token and ours within NEAR_TIE."""
    got = list(model.generate(ids, max_tokens=len(want), stop_at_eog=False))
    split = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if split is None:
        return
    logits = model.logits(ids + want[:split])[-1]  # our logits on llama.cpp's path
    margin = abs(float(logits[want[split]] - logits[got[split]]))
    assert margin < NEAR_TIE, f"greedy splits from llama.cpp at step {split} (margin {margin:.3f})"


def assert_synth_logits(tr: Any, ref: Any, tol: dict[str, Any], name: str) -> None:
    """A synth .npz's logits (its `ids`; batched, one token per call, and two calls of 20, the
    second from the cached state) against `tr`'s fused pass, in its slots 0-2; `tol` a manifest
    entry's suggested_tolerance."""
    from engine.model import Chunk  # noqa: PLC0415 - the checks above need no engine

    ids = ref["ids"].tolist()
    batched = tr.forward([Chunk(0, ids, 0)], "all")[0]                              # [n, n_vocab]
    sequential = np.stack([tr.forward([Chunk(1, [t], i)], "last")[0] for i, t in enumerate(ids)])
    half = len(ids) // 2
    first = tr.forward([Chunk(2, ids[:half], 0)], "all")[0]
    second = tr.forward([Chunk(2, ids[half:], half)], "all")[0]   # from the cached state
    assert_within(batched, ref["logits"], tol, f"{name} batched")
    assert_within(sequential, ref["logits_sequential"], tol, f"{name} sequential")
    assert_within(np.concatenate([first, second]), ref["logits_split"], tol, f"{name} split")
    assert_within(second, ref["logits_split"][half:],
                  tol["split_second_call"] | {"top1_agree_min": len(ids) - half - 1},
                  f"{name} split, second call")
