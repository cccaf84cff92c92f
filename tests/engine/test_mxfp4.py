"""MXFP4 (ggml type 39) on its own: the codebook and the E8M0 scale against gguf-py, every byte
value of the scale, the gpt-oss file's expert tensors read as gguf-py reads them, and the
integer-dot kernels on those real weights against the numpy twin, quantizing and rounding.
(tests/test_quants.py and tests/test_matmul.py cover MXFP4 with every type on random blocks.)"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader
from gguf import quants as gguf_quants

from engine.formats import quant_mx
from engine.formats.ggml_types import GGMLQuantizationType as T
from engine.formats.quants import QuantMatrix, dequantize, quant_type, row_bytes
from engine.kernels.matmul import MatmulKernels
from engine.kernels.matmul.reference import matmul_reference
from tests.support.refs import SYNTH3_DIR

FILE = SYNTH3_DIR / "gptoss_d64_e8k2_swa8_sinks_mxfp4.gguf"


def test_codebook_and_layout_are_ggmls() -> None:
    assert gguf_quants.MXFP4.kvalues == quant_mx.CODEBOOK
    assert quant_type(T.MXFP4).block_bytes == 17 and row_bytes(T.MXFP4, 64) == 34


def test_every_scale_byte_is_ggmls_half_e8m0() -> None:
    """Scale bytes 0..250 (subnormal ones, e < 2, included; above 250 times 12 overflows f32)
    with all 16 codes."""
    e = np.arange(251, dtype=np.uint8)
    raw = np.zeros((251, 17), np.uint8)
    raw[:, 0] = e
    raw[:, 1:9] = np.arange(16, dtype=np.uint8).reshape(8, 2) @ np.array([1, 16], np.uint8)  # codes 0..15
    ours = dequantize(raw, T.MXFP4, 32)
    theirs = np.asarray(gguf_quants.dequantize(raw, T.MXFP4), np.float32).reshape(251, 32)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(quant_mx.e8m0_half(e[2:]), np.exp2(e[2:].astype(np.float64) - 128))


@pytest.fixture(scope="module")
def expert_tensors() -> list[tuple[str, np.ndarray, int, int]]:
    """(name, raw uint8 [rows, row bytes], rows, cols) of each MXFP4 tensor, experts stacked."""
    out = []
    for t in GGUFReader(FILE).tensors:
        if t.tensor_type == T.MXFP4:
            cols = int(t.shape[0])
            raw = np.asarray(t.data, np.uint8).reshape(-1, row_bytes(T.MXFP4, cols))
            out.append((t.name, raw, raw.shape[0], cols))
    assert len(out) == 12  # gate, up and down experts of 4 layers
    return out


def test_the_files_experts_read_as_gguf_py_reads_them(expert_tensors) -> None:
    for name, raw, rows, cols in expert_tensors:
        theirs = np.asarray(gguf_quants.dequantize(raw, T.MXFP4), np.float32).reshape(rows, cols)
        np.testing.assert_array_equal(dequantize(raw, T.MXFP4, cols), theirs, err_msg=name)


@pytest.mark.parametrize("portable", [False, True])
def test_kernels_on_the_files_experts_match_the_twin(expert_tensors, portable: bool) -> None:
    rng = np.random.default_rng(39)
    with MatmulKernels([T.MXFP4], portable=portable) as k:
        for name, raw, rows, cols in expert_tensors[:3]:
            w = QuantMatrix(np.ascontiguousarray(raw), T.MXFP4, rows, cols)
            for m in (1, 6):
                x = rng.standard_normal((m, cols)).astype(np.float32)
                want = matmul_reference(w, x)
                np.testing.assert_allclose(k.matmul(w, x), want, rtol=1e-5,
                                           atol=1e-5 * float(np.abs(want).max()), err_msg=name)
