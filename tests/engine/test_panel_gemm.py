"""The panel GEMM (engine/kernels/panel_gemm.py) against its numpy twin in float64, at shapes that
cross every edge of its loop nest: M past a row block and not a whole tile, N not a whole panel,
K over several k slices and not a whole one; split across a pool it gives the same bits."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from engine.kernels.panel_gemm import (
    KC,
    MC,
    PANEL,
    TILE_M,
    TILES,
    PanelGemm,
    PanelMatrix,
    pack_panels,
    reference,
)
from engine.kernels.pool import Pool

SHAPES = [(1, 1, 1), (5, 7, 3), (TILE_M + 1, PANEL + 16, KC + 5), (MC + 7, 3 * PANEL - 5, 2 * KC + 31),
          (40, 72, 4096 // 8)]


@pytest.fixture(scope="module")
def gemm() -> PanelGemm:
    return PanelGemm()


@pytest.mark.parametrize("panel", sorted(TILES))
def test_panels_are_k_major_slabs_padded_with_zeros(panel: int) -> None:
    w = np.arange(70 * 3, dtype=np.float32).reshape(70, 3)
    p = pack_panels(w, panel)
    n_p = -(-70 // panel)
    assert p.shape == (n_p, 3, panel)
    for r in range(n_p * panel):
        for k in range(3):
            assert p[r // panel, k, r % panel] == (w[r, k] if r < 70 else 0)


@pytest.mark.parametrize("panel", sorted(TILES))
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_the_kernel_is_the_float64_product(gemm: PanelGemm, panel: int, dtype: type, m: int, n: int,
                                           k: int) -> None:
    rng = np.random.default_rng(m * 1000 + n + k)
    w = PanelMatrix.pack(rng.standard_normal((n, k)).astype(dtype), panel)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = gemm.matmul(w, x)
    want = reference(w.data, x, n)
    # f32 sums of k products of f32-exact terms: within a few ulps of the magnitude of the sums
    bound = 4 * k * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w.data.astype(np.float64)
                                                                    .transpose(0, 2, 1)
                                                                    .reshape(-1, k)[:n]).T) + 1e-30
    assert got.shape == (m, n)
    assert np.all(np.abs(got - want) <= bound)


def test_columns_past_n_and_rows_past_m_are_never_written(gemm: PanelGemm) -> None:
    rng = np.random.default_rng(1)
    n, m, k = PANEL + 3, TILE_M + 2, 20
    w = PanelMatrix.pack(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    buf = np.full((m + 2) * n, 7.0, np.float32)  # out, then two rows' worth that must stay 7
    gemm.matmul(w, x, out=buf[:m * n].reshape(m, n))
    assert np.array_equal(buf[m * n:], np.full(2 * n, 7.0, np.float32))
    assert np.allclose(buf[:m * n].reshape(m, n), reference(w.data, x, n), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("panel", sorted(TILES))
def test_split_across_a_pool_gives_the_same_bits(gemm: PanelGemm, panel: int) -> None:
    rng = np.random.default_rng(2)
    w = PanelMatrix.pack(rng.standard_normal((5 * panel + 9, 300)).astype(np.float16), panel)
    x = rng.standard_normal((77, 300)).astype(np.float32)
    with Pool(2) as pool:
        split = PanelGemm(pool).matmul(w, x)
    assert np.array_equal(split, gemm.matmul(w, x))
    with ThreadPoolExecutor(3) as ex:  # chunks taken by free threads
        chunked = PanelGemm(executor=ex, n_threads=3).matmul(w, x)
    assert np.array_equal(chunked, gemm.matmul(w, x))


def test_bad_operands_are_refused(gemm: PanelGemm) -> None:
    w = PanelMatrix.pack(np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="x must be"):
        gemm.matmul(w, np.zeros((2, 9), np.float32))
    with pytest.raises(ValueError, match="float16 or float32"):
        PanelMatrix.pack(np.zeros((4, 8), np.float64))
    with pytest.raises(ValueError, match="panel must be"):
        PanelMatrix.pack(np.zeros((4, 8), np.float32), 48)
