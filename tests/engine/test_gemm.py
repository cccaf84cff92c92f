"""Row-interleaved kernels (engine.kernels.gemm) against their numpy twin (engine.formats.repack)."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from engine.formats.activations import dequantize_activations, quantize_activations
from engine.formats.quants import QuantMatrix, dequantize, random_quant_matrix
from engine.formats.repack import (
    ACTIVATION,
    BLOCK_ELEMS,
    GGML_ACT,
    REPACKED,
    RepackedMatrix,
    T,
    can_repack,
    quantize_rows,
    repack,
)
from engine.kernels import gemm, jit
from engine.kernels.gemm.facade import GemmKernels, host_isa
from engine.kernels.gemm.reference import reference
from engine.kernels.gemm.repack_ir import COMPILED, CompiledRepack
from engine.kernels.matmul import MatmulKernels

TYPES = list(REPACKED)
IDS = [t.name for t in TYPES]
N_ROWS = 48  # three groups of 16


def _isas() -> list[str]:
    have = ["portable"]
    if jit.host_has("avx2"):
        have.append("avx2")
    if host_isa() == "vnni512":
        have.append("vnni512")
    return have


@pytest.fixture(scope="module", params=_isas())
def kernels(request: pytest.FixtureRequest) -> Iterator[GemmKernels]:
    yield GemmKernels(TYPES, request.param)


def _case(qtype: T, m: int, n_blocks: int = 3, seed: int = 0) -> tuple[QuantMatrix, np.ndarray]:
    rng = np.random.default_rng(100 * qtype.value + m + seed)
    elems = BLOCK_ELEMS[qtype]
    w = random_quant_matrix(qtype, N_ROWS, elems * n_blocks, rng)
    x = rng.normal(0, 1, size=(m, w.n_cols)).astype(np.float32)
    return w, x


def _assert_same_math(got: np.ndarray, w: QuantMatrix, x: np.ndarray) -> None:
    """Kernel vs twin, up to float32 rounding of a few terms per block; the bound scales with
    sum |w_j x_j|, so a wrong value, scale, offset or lane misses it by orders of magnitude."""
    ref = reference(w, x)
    act = GGML_ACT[ACTIVATION[w.qtype]]
    xs = dequantize_activations(quantize_activations(x, act), act, w.n_cols)
    scale = np.abs(xs.astype(np.float64)) @ np.abs(dequantize(w.raw, w.qtype, w.n_cols).T)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.all(np.abs(got - ref) <= 2e-6 * scale + 1e-30), np.abs(got - ref).max() / scale.max()


@pytest.mark.parametrize("m", [1, 4, 7])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_kernel_matches_the_twin(kernels: GemmKernels, qtype: T, m: int) -> None:
    if not kernels.has(qtype):
        assert qtype in (T.Q8_0, T.IQ4_NL, T.IQ4_XS) and kernels.isa == "avx2"  # maddubs saturates
        pytest.skip(f"{qtype.name} has no AVX2 form (the file-layout kernel serves it)")
    w, x = _case(qtype, m)
    _assert_same_math(kernels.matmul(repack(w), x), w, x)


@pytest.mark.parametrize("qtype", sorted(gemm.FILE_LAYOUT_BITS, key=lambda t: t.value),
                         ids=lambda t: t.name)
def test_kernel_gives_the_file_layout_kernels_bits(kernels: GemmKernels, qtype: T) -> None:
    """The same float operations in the same order as engine.kernels.matmul's tiles (which
    agree with llama.cpp), so repacking a matrix changes no bit of a model's logits."""
    if not kernels.has(qtype):
        pytest.skip(f"{qtype.name} has no {kernels.isa} form")
    for m, n_blocks in ((1, 5), (3, 2), (6, 7)):
        w, x = _case(qtype, m, n_blocks, seed=m)
        x[0, :w.n_cols // n_blocks] *= 1e-3   # blocks of very different size: rounding shows
        with MatmulKernels([qtype], portable=kernels.isa == "portable", interleaved=False) as file:
            assert np.array_equal(kernels.matmul(repack(w), x), file.matmul(w, x))


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_every_isa_gives_the_same_bits(qtype: T) -> None:
    w, x = _case(qtype, 6)
    rw = repack(w)
    results = [GemmKernels([qtype], isa).matmul(rw, x) for isa in _isas()
               if gemm.supported(qtype, isa)]
    for r in results[1:]:
        assert np.array_equal(r, results[0])


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_rows_do_not_depend_on_the_batch_or_the_split(kernels: GemmKernels, qtype: T) -> None:
    if not kernels.has(qtype):
        pytest.skip("no kernel for this type here")
    w, x = _case(qtype, 9)
    rw = repack(w)
    whole = kernels.matmul(rw, x)
    for splits in (2, 3, 5):  # ranges that cut groups of 16 anywhere
        assert np.array_equal(kernels.matmul(rw, x, splits=splits), whole)
    for m in range(9):  # a row alone (single-row path) or inside a tile: the same bits
        assert np.array_equal(kernels.matmul(rw, x[m:m + 1])[0], whole[m])


@pytest.mark.parametrize("act", ["r8_0", "r8_1", "r8_k"])
def test_compiled_quantizer_writes_the_twins_bytes(act: str) -> None:
    k = GemmKernels(TYPES, "portable")
    rng = np.random.default_rng(7)
    x = rng.normal(0, 3, size=(5, 512)).astype(np.float32)
    x[2, :256] = 0.0  # an all-zero block
    got = k.quantize(x, act)
    assert np.array_equal(got, quantize_rows(x, act))
    if jit.host_has("avx2"):
        assert np.array_equal(GemmKernels(TYPES, host_isa()).quantize(x, act), got)


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_repacking_keeps_every_value(qtype: T) -> None:
    """The repacked bytes decode (with the layout engine.formats.repack documents) to the same values:
    the twin reads the source, so this checks the layout itself, lane by lane."""
    w, _ = _case(qtype, 1, seed=3)
    rw = repack(w)
    extra = {T.Q2_K: 256, T.Q3_K: 64, T.Q4_K: 64, T.Q5_K: 64, T.IQ4_XS: 32}.get(qtype, 0)  # per
    # group block: the unpacked scales
    assert rw.nbytes == w.nbytes + (w.n_rows // 16) * (w.n_cols // 256) * extra
    # one-hot activations pick single columns: out[r] = W[r, j] * (127 * dx)
    k = GemmKernels([qtype], "portable")
    act = GGML_ACT[ACTIVATION[qtype]]
    for j in (0, 5, 37, w.n_cols - 1):
        e = np.zeros((1, w.n_cols), np.float32)
        e[0, j] = 1.0
        seen = dequantize_activations(quantize_activations(e, act), act, w.n_cols)[0, j]
        col = k.matmul(rw, e)[0]
        want, atol = dequantize(w.raw, w.qtype, w.n_cols)[:, j] * seen, 1e-12
        if act == "q8_1":  # d * q * dx + m * s, s = f16(dx * 127) as stored: they can cancel
            want = reference(w, e)[0]
            atol = 1e-6 * float(np.abs(want).max())
        elif qtype in (T.Q2_K, T.Q4_K, T.Q5_K):  # d*dx * sc*q - dmin*dx * mn, two f32 products: they
            atol = 1e-6 * float(np.abs(want).max())  # can cancel too (a wrong value is ~1e-3 off)
        np.testing.assert_allclose(col, want, rtol=1e-6, atol=atol)


@pytest.mark.parametrize("qtype", COMPILED, ids=[t.name for t in COMPILED])
def test_compiled_repack_writes_the_numpy_repacks_bytes(qtype: T) -> None:
    rng = np.random.default_rng(11)
    compiled = CompiledRepack((qtype,))
    for n_rows, n_blocks in ((16, 1), (48, 3), (64, 7)):
        w = random_quant_matrix(qtype, n_rows, n_blocks * BLOCK_ELEMS[qtype], rng)
        assert np.array_equal(repack(w, compiled.into).data, repack(w).data)
    assert GemmKernels([qtype], host_isa()).repack(w).data.tobytes() == repack(w).data.tobytes()


def test_what_cannot_be_repacked_is_refused() -> None:
    rng = np.random.default_rng(0)
    assert not can_repack(T.Q8_0, 24, 64)   # rows not a multiple of 16
    assert not can_repack(T.BF16, 32, 256)  # no interleaved kernel for the type
    with pytest.raises(ValueError, match="cannot repack"):
        repack(random_quant_matrix(T.Q8_0, 24, 64, rng))
    with pytest.raises(ValueError, match="RepackedMatrix"):
        GemmKernels([T.Q8_0], "portable").matmul(random_quant_matrix(T.Q8_0, 32, 64, rng),
                                                 np.zeros((1, 64), np.float32))


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_the_facade_runs_repacked_matrices_on_threads(qtype: T) -> None:
    """MatmulKernels.prepare repacks what the interleaved kernels cover; its matmul (one thread
    or split across two) gives the kernel's bits."""
    w, x = _case(qtype, 5, n_blocks=8)
    with MatmulKernels([qtype]) as one, MatmulKernels([qtype], n_threads=2) as two:
        p = one.prepare(w)
        if not isinstance(p, RepackedMatrix):
            assert not GemmKernels([qtype]).runs_in_models(qtype)
            pytest.skip("models keep this type in the file's layout on this host")
        ref = GemmKernels([qtype], host_isa()).matmul(p, x)
        assert np.array_equal(one.matmul(p, x), ref)
        from engine.kernels.matmul import facade
        saved, facade.MIN_SPLIT_BYTES = facade.MIN_SPLIT_BYTES, 1
        try:
            assert np.array_equal(two.matmul(p, x), ref)
        finally:
            facade.MIN_SPLIT_BYTES = saved
