"""engine/kernels/layer_norm.py against LayerNorm in float64 (and against the encoder's numpy
twin), on rows with large offsets and spreads, in place and out of place; its refusals."""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels.layer_norm import layer_norm_rows
from engine.vision.encoder import layer_norm


def _float64(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(axis=1, keepdims=True)
    return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + eps) * w + b


@pytest.mark.parametrize("rows,n,offset,spread", [(1, 16, 0.0, 1.0), (37, 1152, 5.0, 3.0),
                                                  (4, 48, -100.0, 1.0)])
def test_rows_are_the_float64_layer_norm(rows: int, n: int, offset: float, spread: float) -> None:
    rng = np.random.default_rng(n + rows)
    x = (rng.standard_normal((rows, n)) * spread + offset).astype(np.float32)
    w, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    want = _float64(x, w, b, 1e-6)
    got = layer_norm_rows(x, w, b, 1e-6)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 2e-5 * scale
    assert np.abs(got - layer_norm(x, w, b, 1e-6)).max() <= 2e-5 * scale
    y = x.copy()
    assert np.array_equal(layer_norm_rows(y, w, b, 1e-6, out=y), got)  # in place: the same


def test_shapes_it_cannot_take_are_refused() -> None:
    x, w = np.zeros((2, 20), np.float32), np.zeros(20, np.float32)
    with pytest.raises(ValueError, match="16"):
        layer_norm_rows(x, w, w, 1e-6)
    with pytest.raises(ValueError, match="w must be"):
        layer_norm_rows(np.zeros((2, 32), np.float32), w, w, 1e-6)
