"""The encoder's elementwise kernels against their numpy twins: f16 rounding (the input of an
F16 weight's GEMM) and ggml's table GELU, bit for bit, including the ends and odd sizes; and
its attention's panel layout against the panel GEMM's own packing."""
from __future__ import annotations

import numpy as np
import pytest

from engine.encoder import _head_panels, gelu_f16, gelu_f16_table
from engine.kernels.f16_round import reference as round_reference
from engine.kernels.f16_round import round_f16
from engine.kernels.gelu_table import gelu_table
from engine.kernels.panel_gemm import PanelMatrix


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


@pytest.mark.parametrize(("n", "n_head", "head_dim"), [(128, 12, 64), (37, 4, 16), (200, 2, 96)])
def test_attention_head_panels_are_what_pack_makes(n: int, n_head: int, head_dim: int) -> None:
    """The encoder lays out every head's keys and values in one copy; each head's panels equal
    PanelMatrix.pack of its slice (keys [n, hd] 64 wide, values [hd, n] 32 wide)."""
    x = np.random.default_rng(3).standard_normal((n, n_head * head_dim)).astype(np.float32)
    keys = _head_panels(x, n_head, head_dim)
    values = _head_panels(x, n_head, head_dim, values=True)
    for h in range(n_head):
        xh = np.ascontiguousarray(x[:, h * head_dim:(h + 1) * head_dim])
        for got, want in ((keys[h], PanelMatrix.pack(xh, 64)),
                          (values[h], PanelMatrix.pack(np.ascontiguousarray(xh.T)))):
            assert (got.n_rows, got.n_cols) == (want.n_rows, want.n_cols)
            assert got.data.flags.c_contiguous and np.array_equal(got.data, want.data)
