"""Compiled matmul kernels against their numpy twin (engine.kernels.matmul.matmul_reference)."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from engine.formats.quants import (
    SUPPORTED,
    TYPES,
    T,
    activation_type,
    dequantize,
    dequantize_activations,
    pack_activations,
    quantize_activations,
    random_quant_matrix,
)
from engine.kernels import matmul
from engine.kernels.matmul import MatmulKernels, facade, matmul_reference

ALL_TYPES = sorted(SUPPORTED, key=lambda t: t.value)
IDS = [t.name for t in ALL_TYPES]
N_ROWS = 13  # odd: leftover rows after any even split


def _n_cols(qtype: T) -> int:
    if TYPES[qtype].block_elems == 256:  # K-quants, IQ4_XS
        return 512
    if qtype in (T.F32, T.F16, T.BF16):
        return 77  # not a multiple of the 16-wide chunks: exercises the scalar tail
    return 96  # 3 blocks: one pair and one leftover block


@pytest.fixture(scope="module")
def avx2() -> Iterator[MatmulKernels]:
    with MatmulKernels(ALL_TYPES) as k:
        yield k


@pytest.fixture(scope="module")
def no_vnni() -> Iterator[MatmulKernels]:
    with MatmulKernels(ALL_TYPES, vnni=False) as k:
        yield k


@pytest.fixture(scope="module")
def narrow() -> Iterator[MatmulKernels]:
    """No 512-bit row pairs (the same as avx2 on hosts without AVX-512)."""
    with MatmulKernels(ALL_TYPES, wide=False) as k:
        yield k


@pytest.fixture(scope="module")
def portable() -> Iterator[MatmulKernels]:
    with MatmulKernels(ALL_TYPES, portable=True) as k:
        yield k


@pytest.fixture(scope="module")
def two_threads() -> Iterator[MatmulKernels]:
    with MatmulKernels(ALL_TYPES, n_threads=2) as k:
        yield k


@pytest.fixture
def always_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split even tiny matrices across threads (normally only big ones are worth it)."""
    monkeypatch.setattr(facade, "MIN_SPLIT_BYTES", 1)


def _case(qtype: T, m: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(1000 * qtype.value + m + seed)
    w = random_quant_matrix(qtype, N_ROWS, _n_cols(qtype), rng)
    x = rng.normal(0, 1, size=(m, w.n_cols)).astype(np.float32)  # [m, K]
    return w, x


def _assert_same_math(got: np.ndarray, w, x: np.ndarray) -> None:
    """Kernel vs twin: equal up to float32 summation order.

    The bound scales with sum |w_j x_j| (what rounding in a sum of products is proportional to);
    a wrong block, scale or sign would miss it by orders of magnitude.
    """
    ref = matmul_reference(w, x)  # [M, N]
    act = activation_type(w.qtype)
    xs = x if act is None else dequantize_activations(quantize_activations(x, act), act, w.n_cols)
    scale = np.abs(xs.astype(np.float64)) @ np.abs(dequantize(w.raw, w.qtype, w.n_cols).T)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.all(np.abs(got - ref) <= 2e-6 * scale + 1e-30), np.abs(got - ref).max() / scale.max()


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=IDS)
def test_avx2_matches_reference(avx2: MatmulKernels, qtype: T, m: int) -> None:
    w, x = _case(qtype, m)
    _assert_same_math(avx2.matmul(w, x), w, x)


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=IDS)
def test_portable_matches_reference(portable: MatmulKernels, qtype: T, m: int) -> None:
    w, x = _case(qtype, m)
    _assert_same_math(portable.matmul(w, x), w, x)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=IDS)
def test_vnni_and_plain_avx2_give_the_same_bits(avx2: MatmulKernels, no_vnni: MatmulKernels,
                                                qtype: T) -> None:
    """vpdpbusd forms the same integer sums as maddubs + madd (on hosts without VNNI both
    fixtures are plain AVX2)."""
    for m in (1, 6):
        w, x = _case(qtype, m, seed=3)
        np.testing.assert_array_equal(avx2.matmul(w, x), no_vnni.matmul(w, x))
        _assert_same_math(no_vnni.matmul(w, x), w, x)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=IDS)
def test_row_pairs_give_the_same_bits_as_single_rows(avx2: MatmulKernels, narrow: MatmulKernels,
                                                     qtype: T) -> None:
    """With AVX-512 two activation rows share each register, lane for lane the arithmetic of
    one row alone: every batch size gives the narrow kernel's bits."""
    for m in (1, 2, 3, 8, 11, 19):
        w, x = _case(qtype, m, seed=4)
        np.testing.assert_array_equal(avx2.matmul(w, x), narrow.matmul(w, x))


K_QUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
K_IDS = [t.name for t in K_QUANTS]


def _extreme_case(qtype: T, m: int) -> tuple:
    """Every quant at its largest value (all bits set) against activations at +-127 / -128 of
    one sign per 4 values: the K-quants' integer sums at their extremes (maddubs' pairs at
    2 * 63 * -128 for Q6_K, within i16 without saturating)."""
    rng = np.random.default_rng(qtype.value)
    w = random_quant_matrix(qtype, N_ROWS, _n_cols(qtype), rng)
    blocks = w.raw.view(TYPES[qtype].layout)  # [N, nb]; writes go through to w.raw
    for field in ("qs", "qh", "ql", "hmask"):
        if field in blocks.dtype.names:
            blocks[field] = 0xFF
    signs = np.repeat(rng.choice([-1.0, 1.0], size=(m, w.n_cols // 4)), 4, axis=1)  # [m, K]
    return w, signs.astype(np.float32)


@pytest.mark.parametrize("qtype", K_QUANTS, ids=K_IDS)
def test_k_quant_forms_give_the_same_bits(avx2: MatmulKernels, no_vnni: MatmulKernels,
                                          narrow: MatmulKernels, portable: MatmulKernels,
                                          qtype: T) -> None:
    """The K-quants' integer dot products (with VNNI maddubs + vpdpwssd, on plain AVX2 maddubs +
    madd, in portable IR; the AVX-512 build against wide=False) are the same integers: the same
    bits for every tile of rows, random or extreme weights and activations, and the twin's math."""
    for m in (1, 2, 3, 5, 8, 9, 16):
        for w, x in (_case(qtype, m, seed=7), _extreme_case(qtype, m)):
            got = avx2.matmul(w, x)
            for other in (no_vnni, narrow, portable):
                np.testing.assert_array_equal(got, other.matmul(w, x))
            _assert_same_math(got, w, x)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=IDS)
def test_two_threads_give_the_same_bits(avx2: MatmulKernels, two_threads: MatmulKernels,
                                        always_split: None, qtype: T) -> None:
    for m in (1, 5):
        w, x = _case(qtype, m, seed=1)
        np.testing.assert_array_equal(two_threads.matmul(w, x), avx2.matmul(w, x))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=IDS)
def test_rows_do_not_depend_on_the_batch(avx2: MatmulKernels, qtype: T) -> None:
    """A row's result is the same bits alone or in a batch that takes every tile size once
    (M = the sum of the instance's tile sizes, e.g. 8 + 4 + 2 + 1)."""
    m = sum(avx2.tiles)
    w, x = _case(qtype, m, seed=2)
    together = avx2.matmul(w, x)
    for i in range(m):
        np.testing.assert_array_equal(avx2.matmul(w, x[i:i + 1])[0], together[i])


@pytest.mark.parametrize("act", ["q8_0", "q8_1", "q8_k"])
def test_compiled_quantizer_writes_the_twins_bytes(avx2: MatmulKernels, act: str) -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(0, 1, size=(3, 512)).astype(np.float32)  # [3, 512]
    x[0, :256] = 0.0
    x[1] *= np.float32(1e-3)
    x[2, 256:] = np.round(x[2, 256:] * 4) / 4  # exact ties for the rounding mode
    expected = pack_activations(quantize_activations(x, act), act)
    np.testing.assert_array_equal(avx2.quantize(x, act), expected)
    # threads quantize disjoint row ranges into one buffer: the ranges write all of it, no more
    split = np.zeros(expected.size, np.uint8)  # (an odd M's pad row is never written)
    avx2.quantize(x, act, 0, 1, into=split)
    avx2.quantize(x, act, 1, 3, into=split)
    np.testing.assert_array_equal(split, expected)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=IDS)
def test_reference_is_the_float_product_up_to_activation_rounding(qtype: T) -> None:
    """matmul_reference vs dequantize(W) @ x.T in float64: they differ only by the 8-bit rounding
    of x, at most ~half a step (max|x_block| / 254, a bit more where d is an f16) per value."""
    w, x = _case(qtype, 3)
    wd = dequantize(w.raw, w.qtype, w.n_cols).astype(np.float64)  # [N, K]
    exact = x.astype(np.float64) @ wd.T  # [M, N]
    got = matmul_reference(w, x)
    act = activation_type(qtype)
    if act is None:
        np.testing.assert_allclose(got, exact, rtol=1e-6, atol=1e-7 * np.abs(exact).max())
        return
    elems = 256 if act == "q8_k" else 32
    amax = np.abs(x.reshape(3, -1, elems)).max(axis=-1)  # [M, blocks]
    half_step = np.repeat(amax / 127 * 0.57, elems, axis=1)  # [M, K]
    bound = half_step @ np.abs(wd).T  # [M, N]
    err = np.abs(got - exact)
    assert np.all(err <= bound + 1e-6)
    assert err.max() > 0  # the activations really were quantized


def test_big_split_matches_one_thread(avx2: MatmulKernels, two_threads: MatmulKernels) -> None:
    """A matrix big enough to be split for real (no monkeypatching)."""
    rng = np.random.default_rng(5)
    w = random_quant_matrix(T.Q8_0, 8192, 576, rng)  # 5 MB: split across the pool
    assert w.nbytes >= matmul.MIN_SPLIT_BYTES
    x = rng.normal(size=(1, 576)).astype(np.float32)
    np.testing.assert_array_equal(two_threads.matmul(w, x), avx2.matmul(w, x))


def test_out_argument_and_layout_handling(avx2: MatmulKernels) -> None:
    w, x = _case(T.Q4_1, 3)
    out = np.full((3, N_ROWS), np.nan, np.float32)
    assert avx2.matmul(w, x, out) is out
    np.testing.assert_array_equal(out, avx2.matmul(w, x))
    strided = np.asfortranarray(x)  # not C-contiguous, and float64 below: both get converted
    np.testing.assert_array_equal(avx2.matmul(w, strided), out)
    np.testing.assert_array_equal(avx2.matmul(w, x.astype(np.float64)), out)


def test_bad_calls_raise_clear_errors(avx2: MatmulKernels) -> None:
    w, x = _case(T.Q4_1, 2)
    with pytest.raises(ValueError, match=r"shape \[M >= 1, 96\]"):
        avx2.matmul(w, x[:, :64])
    with pytest.raises(ValueError, match="shape"):
        avx2.matmul(w, x[0])
    with pytest.raises(ValueError, match="out must be"):
        avx2.matmul(w, x, np.empty((2, N_ROWS + 1), np.float32))
    with pytest.raises(ValueError, match="out must be"):
        avx2.matmul(w, x, np.empty((2, N_ROWS), np.float64))
    only_q8 = MatmulKernels([T.Q8_0])
    with pytest.raises(ValueError, match="no kernel compiled for Q4_1"):
        only_q8.matmul(w, x)
    with pytest.raises(ValueError, match="unsupported tensor type IQ2_XXS"):
        MatmulKernels([T.IQ2_XXS])
    with pytest.raises(ValueError, match="n_threads"):
        MatmulKernels([T.Q8_0], n_threads=0)


def test_every_type_record_names_a_built_kernel_family() -> None:
    """A type is one record (engine.formats.quants.TYPES): its kernel family exists and takes the
    activation format the record says (float types take f32 activations)."""
    for t in TYPES.values():
        if t.kernel == "float":
            assert t.act is None, t.name
        else:
            assert t.kernel in matmul.FAMILIES and t.act is not None, t.name
