"""engine.formats.quants against gguf-py (the outside reference) and against the definitions."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import quants as gguf_quants

from engine.formats.quants import (
    ACTIVATION_BLOCK,
    ACTIVATION_LAYOUTS,
    SUPPORTED,
    QuantMatrix,
    T,
    activation_row_bytes,
    activation_type,
    dequantize,
    dequantize_activations,
    pack_activations,
    packed_activation_bytes,
    quantize_activations,
    random_quant_matrix,
    row_bytes,
)

ALL_TYPES = sorted(SUPPORTED, key=lambda t: t.value)
SUPER_BLOCKS = {t for t in SUPPORTED if GGML_QUANT_SIZES[t][0] == 256}  # K-quants, IQ4_XS
ACTS = ["q8_0", "q8_1", "q8_k"]


def _ids(types: list[T]) -> list[str]:
    return [t.name for t in types]


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=_ids(ALL_TYPES))
def test_row_bytes_follows_gguf_block_sizes(qtype: T) -> None:
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    assert row_bytes(qtype, 3 * max(elems, 256)) == 3 * max(elems, 256) // elems * nbytes


def test_row_bytes_rejects_partial_blocks_and_unsupported_types() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        row_bytes(T.Q4_0, 48)
    with pytest.raises(ValueError, match="multiple of 256"):
        row_bytes(T.Q4_K, 576)
    with pytest.raises(ValueError, match="unsupported tensor type IQ2_XXS"):
        row_bytes(T.IQ2_XXS, 256)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=_ids(ALL_TYPES))
def test_dequantize_matches_gguf_on_random_blocks(qtype: T) -> None:
    rng = np.random.default_rng(qtype.value)
    n_cols = 512 if qtype in SUPER_BLOCKS else 96
    w = random_quant_matrix(qtype, 7, n_cols, rng)
    ours = dequantize(w.raw, qtype, n_cols)  # [7, n_cols]
    theirs = np.asarray(gguf_quants.dequantize(w.raw, qtype), dtype=np.float32).reshape(7, n_cols)
    assert ours.dtype == np.float32 and ours.shape == (7, n_cols)
    assert np.isfinite(ours).all() and np.abs(ours).max() > 0
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7 * np.abs(theirs).max())


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16], ids=str)
def test_dequantize_inverts_gguf_quantize(qtype: T) -> None:
    """Blocks written by gguf-py's quantizer read back as the values they approximate."""
    rng = np.random.default_rng(7)
    values = rng.normal(0, 0.05, size=(5, 128)).astype(np.float32)
    raw = np.asarray(gguf_quants.quantize(values, qtype)).view(np.uint8).reshape(5, -1)
    back = dequantize(raw, qtype, 128)
    step = {T.Q4_0: 1 / 7, T.Q4_1: 1 / 15, T.Q5_0: 1 / 15, T.Q5_1: 1 / 31, T.Q8_0: 1 / 127,
            T.BF16: 2 ** -8}[qtype]
    amax = np.abs(values).max()
    assert np.abs(back - values).max() <= step * amax * 1.01


def test_random_weights_look_like_a_model() -> None:
    rng = np.random.default_rng(1)
    for qtype in ALL_TYPES:
        w = dequantize(random_quant_matrix(qtype, 16, 256, rng).raw, qtype, 256)
        assert np.isfinite(w).all()
        assert 0.005 < w.std() < 0.1, qtype.name


def test_quant_matrix_validates_its_buffer() -> None:
    raw = np.zeros((4, row_bytes(T.Q4_1, 64)), np.uint8)
    QuantMatrix(raw, T.Q4_1, 4, 64)
    with pytest.raises(ValueError, match="shape"):
        QuantMatrix(raw, T.Q4_1, 4, 96)
    with pytest.raises(ValueError, match="uint8"):
        QuantMatrix(raw.view(np.int8), T.Q4_1, 4, 64)
    with pytest.raises(ValueError, match="C-contiguous"):
        QuantMatrix(np.zeros((8, raw.shape[1]), np.uint8)[::2], T.Q4_1, 4, 64)
    with pytest.raises(ValueError, match="multiple of 256"):
        QuantMatrix(raw, T.Q6_K, 4, 64)


def test_activation_types() -> None:
    assert activation_type(T.F16) is None
    assert activation_type(T.Q8_0) == "q8_0"
    assert {activation_type(t) for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)} == {"q8_1"}
    assert activation_type(T.IQ4_NL) == "q8_0"  # as llama.cpp pairs them
    assert {activation_type(t) for t in SUPER_BLOCKS} == {"q8_k"}


def _activations(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = rng.normal(0, 1, size=(m, k)).astype(np.float32)  # [m, k]
    x[0, :32] = 0.0  # an all-zero block
    x[-1, -32:] *= 1e4  # a loud block
    return x


@pytest.mark.parametrize("act", ACTS)
def test_activation_quantization_definition(act: str) -> None:
    rng = np.random.default_rng(3)
    k = 512
    x = _activations(rng, 3, k)
    packed = quantize_activations(x, act)
    assert packed.dtype == np.uint8 and packed.shape == (3, activation_row_bytes(act, k))
    elems = ACTIVATION_BLOCK[act]
    back = dequantize_activations(packed, act, k).reshape(3, k // elems, elems)
    xb = x.reshape(3, k // elems, elems)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    # each value within half a step of its block (q8_0/q8_1 round d to f16: a little more)
    slack = 0.5 + (1e-6 if act == "q8_k" else 127 * 2 ** -11)
    assert np.all(np.abs(back - xb) <= amax / 127 * slack + 1e-30)
    assert np.all(back.reshape(3, k)[0, :32] == 0)


def test_q8_0_activations_match_gguf_q8_0() -> None:
    """Our q8_0 is ggml's block_q8_0: gguf-py's quantizer writes the same bytes (it rounds
    ties away from zero where we round them to even, and ties are rare in random data)."""
    rng = np.random.default_rng(4)
    x = _activations(rng, 4, 256)
    ours = quantize_activations(x, "q8_0").reshape(4, 8, 34)
    theirs = np.asarray(gguf_quants.quantize(x, T.Q8_0)).view(np.uint8).reshape(4, 8, 34)
    np.testing.assert_array_equal(ours[..., :2], theirs[..., :2])  # f16 scales
    diff = ours[..., 2:].view(np.int8).astype(int) - theirs[..., 2:].view(np.int8).astype(int)
    assert np.abs(diff).max() <= 1 and (diff != 0).mean() < 0.01


def test_activation_block_sums() -> None:
    rng = np.random.default_rng(5)
    x = _activations(rng, 2, 256)
    q1 = quantize_activations(x, "q8_1").reshape(2, 8, 40)
    d = q1[..., 0:4].copy().view(np.float32)[..., 0]
    s = q1[..., 4:8].copy().view(np.float32)[..., 0]
    qs = q1[..., 8:].view(np.int8).astype(np.int64)
    # ggml's block_q8_1: d and s = d * sum(q) rounded to f16, s from the unrounded d
    amax = np.abs(x.reshape(2, 8, 32)).max(axis=-1)
    d_exact = amax / np.float32(127)
    np.testing.assert_array_equal(d, d_exact.astype(np.float16).astype(np.float32))
    s_exact = d_exact * qs.sum(axis=-1).astype(np.float32)
    np.testing.assert_array_equal(s, s_exact.astype(np.float16).astype(np.float32))
    qk = quantize_activations(x, "q8_k").reshape(2, 292)
    qsk = qk[:, 4:260].view(np.int8).astype(np.int64).reshape(2, 16, 16)
    bsums = qk[:, 260:].copy().view(np.int16)
    np.testing.assert_array_equal(bsums, qsk.sum(axis=-1))


def test_activation_quantization_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_activations(np.zeros((1, 96), np.float32), "q8_k")
    with pytest.raises(ValueError, match="2-D"):
        quantize_activations(np.zeros(96, np.float32), "q8_0")
    with pytest.raises(ValueError, match="unknown activation format"):
        quantize_activations(np.zeros((1, 96), np.float32), "q4_0")


def test_huge_activation_blocks_stay_finite() -> None:
    """ggml's f16 block sum would overflow to inf here; we keep the exact f32 value instead."""
    x = np.full((1, 32), 4000.0, dtype=np.float32)  # s = d * sum(q) = 128000 > f16 max
    packed = quantize_activations(x, "q8_1").reshape(40)
    s = packed[4:8].copy().view(np.float32)[0]
    assert np.isfinite(s) and s == pytest.approx(128000.0, rel=1e-6)


@pytest.mark.parametrize("act", ["q8_0", "q8_1"])
def test_packed_activations_hold_each_blocks_values_and_scales(act: str) -> None:
    """pack_activations only moves ggml's block fields: row m's block b values sit in the pair
    (m // 2) at half m % 2, its scales in group m // 8 at lane m % 8 (layout in its docstring)."""
    rng = np.random.default_rng(5)
    m_rows, nb = 11, 3
    x = rng.normal(size=(m_rows, 32 * nb)).astype(np.float32)
    blocks = quantize_activations(x, act).view(ACTIVATION_LAYOUTS[act]).reshape(m_rows, nb)
    packed = pack_activations(quantize_activations(x, act), act)
    assert packed.size == packed_activation_bytes(act, 32 * nb, m_rows)
    pairs, groups, k = -(-m_rows // 2), -(-m_rows // 8), 2 if act == "q8_1" else 1
    qs = packed[:pairs * nb * 64].view(np.int8).reshape(pairs, nb, 2, 32)
    scales = packed[pairs * nb * 64:].view(np.float32).reshape(groups, nb, k, 8)
    for m in range(m_rows):
        for b in range(nb):
            np.testing.assert_array_equal(qs[m // 2, b, m % 2], blocks["qs"][m, b])
            assert scales[m // 8, b, 0, m % 8] == np.float32(blocks["d"][m, b])
            if act == "q8_1":
                assert scales[m // 8, b, 1, m % 8] == blocks["s"][m, b]
    assert not qs[m_rows // 2, :, 1].any()  # the odd M's missing partner
