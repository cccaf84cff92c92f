"""The encoder's elementwise kernels against their numpy twins: f16 rounding (the input of an
F16 weight's GEMM) and ggml's table GELU, bit for bit, including the ends and odd sizes."""
from __future__ import annotations

import numpy as np
import pytest

from engine.encoder import gelu_f16, gelu_f16_table
from engine.kernels.f16_round import reference as round_reference
from engine.kernels.f16_round import round_f16
from engine.kernels.gelu_table import gelu_table


def _wide_range(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values from f16's subnormals past its largest finite (overflow to inf), both signs."""
    rng = np.random.default_rng(seed)
    mags = np.exp(rng.uniform(np.log(1e-8), np.log(1e6), shape))
    return (mags * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


@pytest.mark.parametrize("shape", [(64, 768), (3, 37), (1,), (0, 16)])
def test_round_f16_equals_numpys_cast(shape: tuple[int, ...]) -> None:
    x = _wide_range(shape)
    with np.errstate(over="ignore"):
        want = round_reference(x)
    got = round_f16(x)
    assert np.array_equal(got, want)
    round_f16(x, out=x)  # in place
    assert np.array_equal(x, want)


def test_round_f16_refuses_a_strided_input() -> None:
    with pytest.raises(ValueError, match="C-contiguous float32"):
        round_f16(np.zeros((4, 32), np.float32)[:, ::2])


def test_gelu_table_equals_the_numpy_twin_bit_for_bit() -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((96, 3072)) * 5).astype(np.float32)
    x[0, :8] = [10.0, -10.0, 9.999, -9.999, 1e6, -1e6, 0.0, -0.0]
    x[1] = _wide_range((3072,), seed=2)
    table = gelu_f16_table()
    assert np.array_equal(gelu_table(x, table), gelu_f16(x))
    y = x.copy()
    gelu_table(y, table, out=y)  # in place
    assert np.array_equal(y, gelu_f16(x))


def test_gelu_table_refuses_sizes_off_its_lanes() -> None:
    with pytest.raises(ValueError, match="16 k values"):
        gelu_table(np.zeros((2, 17), np.float32), gelu_f16_table())
