"""engine/kernels/row_softmax.py against ops' float64 softmax twin: rows of attention-like
scores (wide spread, large offsets, -1e30 masked entries), in place, and its refusals."""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels.ops import softmax_reference
from engine.kernels.row_softmax import softmax_rows


@pytest.mark.parametrize("rows,n,spread,offset", [(1, 16, 1.0, 0.0), (7, 4096, 4.0, 0.0),
                                                  (3, 784, 30.0, 1000.0), (5, 64, 0.0, -50.0)])
def test_rows_are_the_float64_softmax(rows: int, n: int, spread: float, offset: float) -> None:
    x = (np.random.default_rng(n).standard_normal((rows, n)) * spread + offset).astype(np.float32)
    want = softmax_reference(x)
    got = softmax_rows(x.copy())
    assert np.allclose(got, want, rtol=2e-6 * np.sqrt(n), atol=1e-9)
    assert np.allclose(got.sum(axis=1, dtype=np.float64), 1.0, atol=1e-5)


def test_far_below_the_row_max_is_exactly_zero() -> None:
    x = np.zeros((2, 32), np.float32)
    x[:, 5] = -1e30   # what a mask adds
    x[1, 7] = 200.0   # e^(0 - 200) underflows: 0, and row 1 is one-hot
    got = softmax_rows(x.copy())
    assert got[0, 5] == 0 and got[1, 5] == 0
    assert got[1, 7] == pytest.approx(1.0, abs=1e-7) and np.all(np.delete(got[1], 7) == 0)


def test_shapes_it_cannot_take_are_refused() -> None:
    with pytest.raises(ValueError, match="16"):
        softmax_rows(np.zeros((2, 20), np.float32))
    with pytest.raises(ValueError, match="float32"):
        softmax_rows(np.zeros((2, 32), np.float64))
