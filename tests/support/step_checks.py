"""The fused forward pass against its eager twin on the same model (tests/engine/test_step.py,
tests/engine/test_kvq_graph.py): both call the same kernels, so outputs and caches must agree
bit for bit."""
from __future__ import annotations

from typing import Any

import numpy as np

from engine.model import Chunk


def fused_and_eager(model: Any, calls: list[tuple[list[Chunk], str]]) -> None:
    """Run each call on slots s (fused) and s + half (eager); outputs and caches must be equal."""
    tr = model.transformer
    half = model.n_slots // 2
    for chunks, output in calls:
        fused = tr.forward(chunks, output)
        eager = tr.forward_eager([Chunk(c.slot + half, c.prompt, c.pos0, c.logits) for c in chunks], output)
        assert len(fused) == len(eager) == len(chunks)
        for a, b in zip(fused, eager):
            np.testing.assert_array_equal(a, b)
    for s in range(half):
        n = len(tr.cache.tokens[s])
        assert tr.cache.tokens[s] == tr.cache.tokens[s + half]
        for g, group in enumerate(tr.cache.layout.groups):  # a ring is compared whole
            rows = slice(None) if group.is_ring else slice(0, n)
            np.testing.assert_array_equal(tr.cache.k[g][s, :, rows], tr.cache.k[g][s + half, :, rows])
            np.testing.assert_array_equal(tr.cache.v[g][s, :, rows], tr.cache.v[g][s + half, :, rows])
