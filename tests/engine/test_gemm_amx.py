"""The legacy types' AMX-INT8 prefill products (engine.kernels.gemm.amx) against the VNNI nest's
bits and the numpy twin (engine.kernels.gemm.reference). Hosts without AMX-INT8 skip these: the
VNNI nest they run is tested by test_gemm.py."""
from __future__ import annotations

import numpy as np
import pytest

from engine.formats.activations import dequantize_activations, quantize_activations
from engine.formats.quants import QuantMatrix, dequantize, random_quant_matrix
from engine.formats.repack import ACTIVATION, GGML_ACT, T, repack
from engine.kernels import amx_state
from engine.kernels.gemm import amx
from engine.kernels.gemm.facade import GemmKernels, host_isa
from engine.kernels.gemm.reference import reference

pytestmark = pytest.mark.skipif(not (host_isa() == "vnni512" and amx_state.available("amx-int8")),
                                reason="the CPU has no AMX-INT8 (or no AVX-512 VNNI)")

TYPES = sorted(amx.TYPES, key=lambda t: t.value)
IDS = [t.name for t in TYPES]


def _case(qtype: T, m: int, n_blocks: int, seed: int = 0) -> tuple[QuantMatrix, np.ndarray]:
    rng = np.random.default_rng(1000 * qtype.value + 7 * m + n_blocks + seed)
    w = random_quant_matrix(qtype, 48, 32 * n_blocks, rng)
    x = rng.normal(0, 1, size=(m, w.n_cols)).astype(np.float32)
    x[::3, :32] *= 1e-3   # blocks of very different size: a changed rounding order shows
    x[1::5, -64:] *= 50.0
    return w, x


def _within_twin(got: np.ndarray, w: QuantMatrix, x: np.ndarray) -> None:
    """Up to float32 rounding of a few terms per block, relative to sum |w_j x_j| (a wrong
    value, scale, offset or row misses by orders of magnitude)."""
    act = GGML_ACT[ACTIVATION[w.qtype]]
    xs = dequantize_activations(quantize_activations(x, act), act, w.n_cols).astype(np.float64)
    scale = np.abs(xs) @ np.abs(dequantize(w.raw, w.qtype, w.n_cols).astype(np.float64).T)
    err = np.abs(got.astype(np.float64) - reference(w, x))
    assert np.all(err <= 2e-6 * scale + 1e-30), (err / scale).max()


@pytest.fixture(scope="module")
def pair() -> tuple[GemmKernels, GemmKernels]:
    return (GemmKernels(TYPES, "vnni512", amx_tiles=True),
            GemmKernels(TYPES, "vnni512", amx_tiles=False))


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
@pytest.mark.parametrize("m, n_blocks", [(16, 3), (37, 5), (64, 18), (33, amx.KB + 6), (20, 2 * amx.KB)])
def test_tiles_give_the_vnni_nests_bits(pair: tuple[GemmKernels, GemmKernels], qtype: T,
                                        m: int, n_blocks: int) -> None:
    """Whole tiles, a tail of rows left to the VNNI nest, quads of blocks and a tail of blocks,
    K slices (n_blocks past KB): every bit as the VNNI nest, and the twin's values."""
    tiles, vnni = pair
    w, x = _case(qtype, m, n_blocks)
    rw = repack(w)
    got = tiles.matmul(rw, x)
    assert np.array_equal(got, vnni.matmul(rw, x))
    _within_twin(got, w, x)


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q5_0], ids=lambda t: t.name)
def test_rows_do_not_depend_on_the_batch_or_the_split(pair: tuple[GemmKernels, GemmKernels],
                                                      qtype: T) -> None:
    tiles, _ = pair
    w, x = _case(qtype, 40, 7)
    rw = repack(w)
    whole = tiles.matmul(rw, x)
    for splits in (2, 3):  # weight-row ranges cut anywhere, as threads take them
        assert np.array_equal(tiles.matmul(rw, x, splits=splits), whole)
    for a, b in ((0, 16), (3, 19), (8, 40), (5, 6)):  # other tiles, tails, a single row
        assert np.array_equal(tiles.matmul(rw, x[a:b]), whole[a:b])

