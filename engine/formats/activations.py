"""ggml's 8-bit activation blocks (q8_0, q8_1, q8_k): layouts, the numpy quantizer and packing.

The matmul kernels (engine/kernels/matmul/) never dequantize weights: they quantize the
activations to these blocks (ggml's scheme) and take integer dot products. `quantize_activations`
is the numpy twin of that step, bit for bit (ggml's block layout), and `pack_activations`
rearranges its blocks into the layout the kernels read. Which weight type takes which format is
part of the type's record (engine.formats.quants.TYPES).
"""
from __future__ import annotations

import numpy as np

from engine.formats.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType

# --- activation block layouts (what the kernels quantize x to) -----------------------------
# q8_0, 32 values, 34 bytes: f16 d | i8 qs[32]  (= ggml block_q8_0)
Q8_0_ACT = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
# q8_1, 32 values, 40 bytes: f32 d | f32 s = d * sum(qs) | i8 qs[32]  (ggml's block_q8_1 as gguf's
#   size table has it). d and s hold f16-rounded values, as today's ggml stores them, so our
#   products follow llama.cpp's; f32 slots save the kernel two conversions per block and row.
Q8_1_ACT = np.dtype([("d", "<f4"), ("s", "<f4"), ("qs", "i1", (32,))])
# q8_k, 256 values, 292 bytes: f32 d | i8 qs[256] | i16 bsums[16] (sum of each 16 qs) (= ggml block_q8_K)
Q8_K_ACT = np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))])

ACTIVATION_LAYOUTS: dict[str, np.dtype] = {"q8_0": Q8_0_ACT, "q8_1": Q8_1_ACT, "q8_k": Q8_K_ACT}
ACTIVATION_BLOCK: dict[str, int] = {"q8_0": 32, "q8_1": 32, "q8_k": 256}
for _t, _layout in [(T.Q8_0, Q8_0_ACT), (T.Q8_1, Q8_1_ACT), (T.Q8_K, Q8_K_ACT)]:
    assert GGML_QUANT_SIZES[_t][1] == _layout.itemsize, _t  # the layouts agree with the format's table


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def _activation_layout(act: str) -> tuple[np.dtype, int]:
    if act not in ACTIVATION_LAYOUTS:
        raise ValueError(f"unknown activation format {act!r}; expected one of {sorted(ACTIVATION_LAYOUTS)}")
    return ACTIVATION_LAYOUTS[act], ACTIVATION_BLOCK[act]


def activation_row_bytes(act: str, n_cols: int) -> int:
    layout, elems = _activation_layout(act)
    if n_cols <= 0 or n_cols % elems:
        raise ValueError(f"{act} rows need a positive multiple of {elems} values, got {n_cols}")
    return n_cols // elems * layout.itemsize


def quantize_activations(x: np.ndarray, act: str) -> np.ndarray:
    """float32 [M, K] -> uint8 [M, activation_row_bytes]: ggml's 8-bit activation blocks.

    Per block, as ggml does it: d = max|x| / 127, q = round-half-even(x * (127 / max|x|)) (0 when
    max|x| == 0), all in float32 exactly as the compiled kernel does it, so both produce the same
    bytes. q8_0/q8_1 scales are rounded to f16 as in ggml's blocks.
    """
    layout, elems = _activation_layout(act)
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"activations must be 2-D [M, K], got shape {x.shape}")
    m_rows, k = x.shape
    activation_row_bytes(act, k)
    xb = x.reshape(m_rows, k // elems, elems)  # [M, nb, elems]
    amax = np.abs(xb).max(axis=-1)
    d = amax / np.float32(127)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    q = np.rint(xb * inv[..., None]).astype(np.int8)
    out = np.zeros((m_rows, k // elems), dtype=layout)
    out["qs"] = q
    # ggml keeps q8_0/q8_1 scales as f16: round them the same way (q8_1 keeps f32 slots, and
    # keeps a value beyond f16's range as it is rather than overflowing to inf)
    if act == "q8_0":
        out["d"] = d.astype(np.float16)
    elif act == "q8_1":
        out["d"] = _round_to_half(d)
        out["s"] = _round_to_half(d * q.astype(np.int32).sum(axis=-1).astype(np.float32))
    else:  # q8_k
        out["d"] = d
        out["bsums"] = q.reshape(m_rows, k // elems, 16, 16).astype(np.int32).sum(axis=-1)
    return out.view(np.uint8).reshape(m_rows, -1)


def _round_to_half(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to f16 precision, except those beyond f16's range (kept)."""
    big = np.abs(x) > np.float32(65504)
    with np.errstate(over="ignore"):
        return np.where(big, x, x.astype(np.float16).astype(np.float32))


def packed_activation_bytes(act: str, n_cols: int, m_rows: int) -> int:
    """Bytes m_rows rows take in pack_activations' layout."""
    activation_row_bytes(act, n_cols)
    nb = n_cols // ACTIVATION_BLOCK[act]
    if act == "q8_k":
        return m_rows * nb * ACTIVATION_LAYOUTS[act].itemsize
    k = 2 if act == "q8_1" else 1
    return -(-m_rows // 2) * nb * 64 + -(-m_rows // 8) * nb * 32 * k


def empty_packed(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 buffer for packed activations, 64-byte aligned so that no 32- or
    64-byte block load straddles a cache line."""
    raw = np.empty(nbytes + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip:skip + nbytes]


def pack_activations(blocks: np.ndarray, act: str) -> np.ndarray:
    """uint8 [M, activation_row_bytes] (ggml's blocks) -> uint8 [packed_activation_bytes]: the
    layout the compiled matmul kernels read.

    q8_0 / q8_1, for M rows of nb blocks:
        qs      i8  [ceil(M / 2), nb, 2, 32]     rows in pairs: a block's values of rows 2p
                                                 and 2p + 1 side by side
        scales  f32 [ceil(M / 8), nb, k, 8]      rows in groups of 8: a block's d (q8_0's f16 d
                                                 widened), then for q8_1 (k = 2) its s = d * sum(qs)
    (rows past M are 0). A kernel takes a block of two rows with one 64-byte load, and a block's
    scales of up to 8 rows with one vector load; every stride along the blocks is a constant.
    q8_k: ggml's blocks as they are.
    """
    layout, _ = _activation_layout(act)
    blocks = np.asarray(blocks, dtype=np.uint8)
    if blocks.ndim != 2:
        raise ValueError(f"activation blocks must be 2-D [M, row bytes], got shape {blocks.shape}")
    if act == "q8_k":
        return blocks.reshape(-1).copy()
    m_rows = blocks.shape[0]
    b = blocks.view(layout).reshape(m_rows, -1)  # [M, nb]
    nb = b.shape[1]
    qs = np.zeros((-(-m_rows // 2) * 2, nb, 32), np.int8)
    qs[:m_rows] = b["qs"]
    qs = qs.reshape(-1, 2, nb, 32).transpose(0, 2, 1, 3)                 # [pairs, nb, 2, 32]
    fields = [b["d"]] + ([b["s"]] if act == "q8_1" else [])
    scales = np.zeros((-(-m_rows // 8) * 8, nb, len(fields)), np.float32)
    for i, field in enumerate(fields):
        scales[:m_rows, :, i] = _f32(field)
    scales = scales.reshape(-1, 8, nb, len(fields)).transpose(0, 2, 3, 1)  # [groups, nb, k, 8]
    return np.concatenate([np.ascontiguousarray(qs).reshape(-1).view(np.uint8),
                           np.ascontiguousarray(scales).reshape(-1).view(np.uint8)])


def dequantize_activations(blocks: np.ndarray, act: str, n_cols: int) -> np.ndarray:
    """uint8 [M, activation_row_bytes] (ggml's blocks, not packed) -> float32 [M, n_cols]:
    d * q per block."""
    layout, _ = _activation_layout(act)
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8 or blocks.ndim != 2:
        raise ValueError(f"expected a 2-D uint8 array of blocks, got {blocks.dtype} {blocks.shape}")
    if blocks.shape[1] != activation_row_bytes(act, n_cols):
        raise ValueError(f"{blocks.shape[1]} bytes per row do not hold {n_cols} {act} values")
    b = np.ascontiguousarray(blocks).view(layout)
    return (_f32(b["d"])[..., None] * _f32(b["qs"])).reshape(blocks.shape[0], n_cols)
