"""The AMX GEMM (engine/kernels/amx_gemm.py) against its numpy twin (the three bf16 products in
float64) and against the exact float64 product, at shapes that cross every edge of its loop nest:
M not a whole tile or 32-row block and past a row block, N not a whole block or pair, K not a
whole k-step and over several k slices; split across threads it gives the same bits; the
compiled packers give the numpy packer's bits. The halves' rule is checked on its own. The CPU
must have AMX-BF16 (the encoder falls back to the panel GEMM elsewhere, tested on every host)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from engine.kernels import amx_gemm
from engine.kernels.amx_gemm import KS, KSTEP, MC, AmxGemm, AmxMatrix, pack, reference, split, widen
from engine.kernels.f16_round import round_f16
from engine.kernels.row_softmax import softmax_rows

pytestmark = pytest.mark.skipif(not amx_gemm.available(), reason="the CPU has no AMX-BF16")

SHAPES = [(1, 1, 1), (5, 7, 3), (17, 16 + 3, KSTEP + 5), (MC + 7, 3 * 32 - 5, KS * KSTEP * 2 + 31),
          (40, 72, 4096 // 8), (192, 72, 300)]


@pytest.fixture(scope="module")
def gemm() -> AmxGemm:
    return AmxGemm()


def test_an_f16_weight_splits_exactly_and_an_activation_keeps_16_bits() -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(10000) * 0.05).astype(np.float16)
    hi, lo = split(w.astype(np.float32))
    assert np.array_equal(widen(hi) + widen(lo), w.astype(np.float64))
    x = (rng.standard_normal(10000) * 10.0 ** rng.integers(-3, 4, 10000)).astype(np.float32)
    hi, lo = split(x)
    assert np.all(np.abs(widen(hi) + widen(lo) - x) <= 2.0 ** -16 * np.abs(x))
    assert np.array_equal(widen(hi), np.asarray(x.view(np.uint32) & 0xFFFF0000, np.uint32)
                          .view(np.float32).astype(np.float64))  # hi: x truncated to 16 bits


def test_packing_is_pair_interleaved_blocks_padded_with_zeros() -> None:
    n, k = 40, 70
    w = np.arange(n * k, dtype=np.float32).reshape(n, k) + 1.0  # distinct, hi + lo exact
    data = pack(w)
    assert data.shape == (2, 3, 2, 2, 16, 32)
    whole = widen(data[:, :, 0]) + widen(data[:, :, 1])
    for p, s, b, r, n_, j in np.ndindex(2, 3, 2, 16, 16, 2):
        row, col = 32 * p + 16 * b + n_, KSTEP * s + 2 * r + j
        want = w[row, col] if row < n and col < k else 0.0
        assert whole[p, s, b, r, 2 * n_ + j] == want


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_the_kernel_is_the_twin_and_near_the_float64_product(gemm: AmxGemm, dtype: type, m: int,
                                                             n: int, k: int) -> None:
    rng = np.random.default_rng(m * 1000 + n + k)
    w = rng.standard_normal((n, k)).astype(dtype)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = gemm.matmul(AmxMatrix.pack(w), x)
    assert got.shape == (m, n)
    magnitude = np.abs(x).astype(np.float64) @ np.abs(w.astype(np.float64)).T + 1e-30
    # the twin: f32 accumulation of the same bf16 products, a few ulps of the sums' magnitude
    assert np.all(np.abs(got - reference(w, x)) <= 4 * k * np.finfo(np.float32).eps * magnitude)
    # the exact product: the halves leave out ~2^-16 of each term
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.all(np.abs(got - exact) <= 2.0 ** -14 * magnitude)


def test_an_out_of_odd_shape_gets_exactly_its_own_elements(gemm: AmxGemm) -> None:
    rng = np.random.default_rng(1)
    m, n, k = 19, 35, 40
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    buf = np.full((m + 2) * n, 7.0, np.float32)
    gemm.matmul(AmxMatrix.pack(w), x, out=buf[:m * n].reshape(m, n))
    assert np.array_equal(buf[m * n:], np.full(2 * n, 7.0, np.float32))
    assert np.allclose(buf[:m * n].reshape(m, n), reference(w, x), rtol=1e-5, atol=1e-5)


def test_rows_with_a_stride_are_read_as_rows(gemm: AmxGemm) -> None:
    rng = np.random.default_rng(3)
    wide = rng.standard_normal((50, 3 * 72)).astype(np.float32)
    w = AmxMatrix.pack(rng.standard_normal((33, 72)).astype(np.float32))
    strided = wide[:, 72:144]
    assert np.array_equal(gemm.matmul(w, strided), gemm.matmul(w, np.ascontiguousarray(strided)))


def test_split_across_threads_gives_the_same_bits(gemm: AmxGemm) -> None:
    rng = np.random.default_rng(2)
    w = AmxMatrix.pack(rng.standard_normal((5 * 32 + 9, 600)).astype(np.float16))
    x = rng.standard_normal((MC + 77, 600)).astype(np.float32)
    with ThreadPoolExecutor(2) as ex:
        split_out = AmxGemm(ex, 2).matmul(w, x)
    assert np.array_equal(split_out, gemm.matmul(w, x))


@pytest.mark.parametrize("n,k", [(100, 72), (33, 40), (4096 // 16, 72), (47, 80)])
def test_compiled_packers_give_the_numpy_packers_bits(gemm: AmxGemm, n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    wide = rng.standard_normal((n, 3 * k + 5)).astype(np.float32)
    w = wide[:, k:2 * k]  # one head's columns: rows with a stride
    rows = gemm.pack_rows(w)
    assert (rows.n_rows, rows.n_cols) == (n, k) and np.array_equal(rows.data, pack(w))
    cols = gemm.pack_cols(w)
    assert (cols.n_rows, cols.n_cols) == (k, n) and np.array_equal(cols.data, pack(np.ascontiguousarray(w.T)))


def test_a_matrix_of_another_type_is_refused() -> None:
    with pytest.raises(ValueError, match="float16 or float32"):
        AmxMatrix.pack(np.zeros((4, 4), np.int8))


@pytest.mark.parametrize("m,n", [(1, 16), (19, 48), (192, 4096 // 4)])
def test_softmax_split_is_softmax_then_split(gemm: AmxGemm, m: int, n: int) -> None:
    rng = np.random.default_rng(m + n)
    s = (rng.standard_normal((m, n)) * 4).astype(np.float32)
    n_ks = -(-n // KSTEP)
    want = gemm.split_rows(softmax_rows(s.copy()), n_ks)
    assert np.array_equal(gemm.softmax_split(s, n_ks), want)
    # and what P V then reads is the softmax (row_softmax's twin), to the halves' accuracy
    e = np.exp(s.astype(np.float64) - s.max(axis=1, keepdims=True))
    halves = gemm.softmax_split(s * 1, n_ks).transpose(0, 3, 1, 2, 4).reshape(-1, n_ks, 2, KSTEP)
    p = (widen(halves[:, :, 0]) + widen(halves[:, :, 1])).reshape(-1, n_ks * KSTEP)
    assert np.allclose(p[:m, :n], e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert not p[m:].any() and not p[:, n:].any()


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_the_f16_input_product_is_its_twin_and_the_f16_product(gemm: AmxGemm, m: int, n: int,
                                                               k: int) -> None:
    """matmul_f16_input (the encoder's F16 projections): x rounded to f16 inside the split, so
    the product is ggml's f16 x f16 one but for the lo x lo term."""
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float16)
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    got = gemm.matmul_f16_input(AmxMatrix.pack(w), x)
    magnitude = np.abs(x).astype(np.float64) @ np.abs(w.astype(np.float64)).T + 1e-30
    twin = amx_gemm.reference_f16_input(w, x)
    assert np.all(np.abs(got - twin) <= 4 * k * np.finfo(np.float32).eps * magnitude)
    f16_product = x.astype(np.float16).astype(np.float64) @ w.astype(np.float64).T
    assert np.all(np.abs(got - f16_product) <= 2.0 ** -14 * magnitude)
    if k >= 32:  # the rounding is there: the unrounded input's product is further off somewhere
        exact = x.astype(np.float64) @ w.astype(np.float64).T
        assert np.abs(got - exact).max() > np.abs(got - f16_product).max()


@pytest.mark.parametrize("m,k", [(37, 70), (MC + 5, 600), (1, 16)])
def test_split_rows_f16_is_split_rows_of_the_rounded_input(m: int, k: int) -> None:
    rng = np.random.default_rng(m + k)
    mags = np.exp(rng.uniform(np.log(1e-8), np.log(1e6), (m, k)))  # f16 subnormals to overflow
    x = (mags * rng.choice([-1.0, 1.0], (m, k))).astype(np.float32)
    n_ks = -(-k // KSTEP)
    with ThreadPoolExecutor(2) as ex:
        threaded = AmxGemm(ex, 2)
        got = threaded.split_rows_f16(x, n_ks)
        assert np.array_equal(got, threaded.split_rows(round_f16(x), n_ks))
