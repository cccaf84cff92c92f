"""GGML block layouts and their numpy reference (de)quantization.

Every quantized row is a run of fixed-size blocks; each layout below is a numpy structured dtype,
so `raw.view(LAYOUT)` turns a uint8 row into an array of blocks with named fields. All multi-byte
fields are little-endian; "f16" is IEEE half.

The matmul kernels (engine/kernels/matmul.py) never dequantize weights: they quantize the
activations to 8-bit blocks (q8_0 / q8_1 / q8_k, ggml's scheme) and take integer dot products.
`quantize_activations` is the numpy twin of that step, bit for bit (ggml's block layout), and
`pack_activations` rearranges its blocks into the layout the kernels read.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from engine.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType

# --- weight block layouts -------------------------------------------------------------------
# Q4_0, 32 values, 18 bytes: f16 d | u8 qs[16]
#   value j (j < 16) = d * ((qs[j] & 0xF) - 8),  value j + 16 = d * ((qs[j] >> 4) - 8)
Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
# Q4_1, 32 values, 20 bytes: f16 d | f16 m | u8 qs[16]
#   value = d * nibble + m, nibbles ordered as in Q4_0 (no -8 offset)
Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])
# Q5_0, 32 values, 22 bytes: f16 d | u32 qh | u8 qs[16]
#   5-bit q_j = nibble_j | (bit j of qh) << 4, value = d * (q_j - 16)
Q5_0 = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
# Q5_1, 32 values, 24 bytes: f16 d | f16 m | u32 qh | u8 qs[16];  value = d * q_j + m
Q5_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
# Q8_0, 32 values, 34 bytes: f16 d | i8 qs[32];  value = d * qs[j]
Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
# Q4_K, 256 values, 144 bytes: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
#   8 sub-blocks of 32 with 6-bit scale sc[j] and min mn[j] packed in `scales` (see
#   _k_scales_mins); qs holds 4 chunks of 32 bytes: chunk c's low nibbles are sub-block 2c, its
#   high nibbles sub-block 2c+1.  value = d * sc[j] * q - dmin * mn[j]
Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
# Q5_K, 256 values, 176 bytes: f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
#   as Q4_K, plus a 5th bit: element l of sub-block j takes bit j of qh[l]
Q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qh", "u1", (32,)),
                 ("qs", "u1", (128,))])
# Q6_K, 256 values, 210 bytes: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
#   two halves of 128 values, each from ql[64h:64h+64], qh[32h:32h+32]; for l < 32:
#     q[l]    = ql[l] & 0xF      | (qh[l] >> 0 & 3) << 4      q[l+64] = ql[l] >> 4    | (qh[l] >> 4 & 3) << 4
#     q[l+32] = ql[l+32] & 0xF   | (qh[l] >> 2 & 3) << 4      q[l+96] = ql[l+32] >> 4 | (qh[l] >> 6 & 3) << 4
#   value i = d * scales[i // 16] * (q[i] - 32)
Q6_K = np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")])

# --- activation block layouts (what the kernels quantize x to) -----------------------------
# q8_0, 32 values, 34 bytes: f16 d | i8 qs[32]  (= ggml block_q8_0)
Q8_0_ACT = Q8_0
# q8_1, 32 values, 40 bytes: f32 d | f32 s = d * sum(qs) | i8 qs[32]  (ggml's block_q8_1 as gguf's
#   size table has it). d and s hold f16-rounded values, as today's ggml stores them, so our
#   products follow llama.cpp's; f32 slots save the kernel two conversions per block and row.
Q8_1_ACT = np.dtype([("d", "<f4"), ("s", "<f4"), ("qs", "i1", (32,))])
# q8_k, 256 values, 292 bytes: f32 d | i8 qs[256] | i16 bsums[16] (sum of each 16 qs) (= ggml block_q8_K)
Q8_K_ACT = np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))])

WEIGHT_LAYOUTS: dict[GGMLQuantizationType, np.dtype] = {
    T.Q4_0: Q4_0, T.Q4_1: Q4_1, T.Q5_0: Q5_0, T.Q5_1: Q5_1, T.Q8_0: Q8_0,
    T.Q4_K: Q4_K, T.Q5_K: Q5_K, T.Q6_K: Q6_K,
}
_FLOAT_TYPES = {T.F32: np.dtype("<f4"), T.F16: np.dtype("<f2"), T.BF16: np.dtype("<u2")}
SUPPORTED: frozenset[GGMLQuantizationType] = frozenset(WEIGHT_LAYOUTS) | frozenset(_FLOAT_TYPES)

ACTIVATION_LAYOUTS: dict[str, np.dtype] = {"q8_0": Q8_0_ACT, "q8_1": Q8_1_ACT, "q8_k": Q8_K_ACT}
ACTIVATION_BLOCK: dict[str, int] = {"q8_0": 32, "q8_1": 32, "q8_k": 256}
# llama.cpp pairs Q4_0/Q5_0 with q8_0; we give them q8_1 (same q and d), whose block sum
# lets the kernel keep the weights unsigned (q * y, then - 8 * d * s) instead of sign-flipping
# both operands: about 25% faster; s's f16 rounding adds noise of the size d's rounding has.
_ACTIVATION_OF: dict[GGMLQuantizationType, str] = {
    T.Q8_0: "q8_0",
    T.Q4_0: "q8_1", T.Q5_0: "q8_1", T.Q4_1: "q8_1", T.Q5_1: "q8_1",
    T.Q4_K: "q8_k", T.Q5_K: "q8_k", T.Q6_K: "q8_k",
}

for _t, _layout in [*WEIGHT_LAYOUTS.items(), (T.Q8_1, Q8_1_ACT), (T.Q8_K, Q8_K_ACT)]:
    assert GGML_QUANT_SIZES[_t][1] == _layout.itemsize, _t  # the layouts agree with the format's table


def _check_supported(qtype: GGMLQuantizationType) -> None:
    if qtype not in SUPPORTED:
        name = getattr(qtype, "name", repr(qtype))
        raise ValueError(f"unsupported tensor type {name}; supported: "
                         f"{', '.join(sorted(t.name for t in SUPPORTED))}")


def block_size(qtype: GGMLQuantizationType) -> tuple[int, int]:
    """(values per block, bytes per block) of a supported type."""
    _check_supported(qtype)
    return GGML_QUANT_SIZES[qtype]


def row_bytes(qtype: GGMLQuantizationType, n_cols: int) -> int:
    """Bytes in one row of `n_cols` values; n_cols must be a whole number of blocks."""
    elems, nbytes = block_size(qtype)
    if n_cols <= 0 or n_cols % elems:
        raise ValueError(f"{qtype.name} rows need a positive multiple of {elems} values, got {n_cols}")
    return n_cols // elems * nbytes


def activation_type(qtype: GGMLQuantizationType) -> str | None:
    """Format the kernels quantize activations to for this weight type (None: f32 activations)."""
    _check_supported(qtype)
    return _ACTIVATION_OF.get(qtype)


@dataclass(frozen=True, eq=False)
class QuantMatrix:
    """A weight matrix still in its quantized blocks: out = W @ x for x of n_cols values."""

    raw: np.ndarray  # uint8 [n_rows, row_bytes], C-contiguous (may be a view into an mmap)
    qtype: GGMLQuantizationType
    n_rows: int  # output features (ggml ne[1])
    n_cols: int  # input features (ggml ne[0])

    def __post_init__(self) -> None:
        expected = (self.n_rows, row_bytes(self.qtype, self.n_cols))
        if not isinstance(self.raw, np.ndarray) or self.raw.dtype != np.uint8:
            raise ValueError("QuantMatrix.raw must be a uint8 numpy array")
        if self.raw.shape != expected:
            raise ValueError(f"{self.qtype.name} {self.n_rows}x{self.n_cols} needs raw of shape "
                             f"{expected}, got {self.raw.shape}")
        if not self.raw.flags.c_contiguous:
            raise ValueError("QuantMatrix.raw must be C-contiguous")

    @functools.cached_property
    def address(self) -> int:
        """Address of the first byte (computed once; kernels take it as an integer)."""
        return int(self.raw.ctypes.data)

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)


def _blocks(raw: np.ndarray, layout: np.dtype, n_cols: int, elems: int) -> np.ndarray:
    """uint8 [rows, row_bytes] -> structured [rows, n_blocks]."""
    if raw.dtype != np.uint8 or raw.ndim != 2:
        raise ValueError(f"expected a 2-D uint8 array of blocks, got {raw.dtype} {raw.shape}")
    if n_cols <= 0 or n_cols % elems or raw.shape[1] != n_cols // elems * layout.itemsize:
        raise ValueError(f"{raw.shape[1]} bytes per row do not hold {n_cols} values "
                         f"in blocks of {elems} / {layout.itemsize} bytes")
    return np.ascontiguousarray(raw).view(layout)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """u8 [..., 16] -> u8 [..., 32]: low nibbles are values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits32(qh: np.ndarray) -> np.ndarray:
    """u32 [...] -> u8 [..., 32]: bit j of each word."""
    return ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """u8 [..., 12] -> (sc, mn) u8 [..., 8]: the 6-bit scales and mins of Q4_K/Q5_K.

    Bytes 0..3 hold sc[0..3] in their low 6 bits, bytes 4..7 mn[0..3]; byte 8+j holds the low
    4 bits of sc[4+j] (low nibble) and mn[4+j] (high nibble), whose top 2 bits are the top bits
    of bytes j (sc) and 4+j (mn).
    """
    lo, mid, hi = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def _dequantize_blocks(b: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """structured [rows, nb] -> float32 [rows, nb, block values]."""
    if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        q = _nibbles(b["qs"]).astype(np.int32)  # [rows, nb, 32]
        if qtype in (T.Q5_0, T.Q5_1):
            q |= _bits32(b["qh"]).astype(np.int32) << 4
        d = _f32(b["d"])[..., None]
        if qtype == T.Q4_0:
            return d * _f32(q - 8)
        if qtype == T.Q5_0:
            return d * _f32(q - 16)
        return d * _f32(q) + _f32(b["m"])[..., None]
    if qtype == T.Q8_0:
        return _f32(b["d"])[..., None] * _f32(b["qs"])
    if qtype in (T.Q4_K, T.Q5_K):
        sc, mn = _k_scales_mins(b["scales"])  # [rows, nb, 8]
        qs = b["qs"].reshape(*b.shape, 4, 1, 32)
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(*b.shape, 8, 32)
        if qtype == T.Q5_K:
            qh = b["qh"][..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]  # [.., 8, 32]
            q = q | ((qh & 1) << 4)
        d = (_f32(b["d"])[..., None] * _f32(sc))[..., None]
        m = (_f32(b["dmin"])[..., None] * _f32(mn))[..., None]
        return (d * _f32(q) - m).reshape(*b.shape, 256)
    if qtype == T.Q6_K:
        ql = b["ql"].reshape(*b.shape, 2, 64).astype(np.int32)
        qh = b["qh"].reshape(*b.shape, 2, 32).astype(np.int32)
        a, c = ql[..., :32], ql[..., 32:]
        q = np.concatenate([
            (a & 0xF) | ((qh & 3) << 4), (c & 0xF) | (((qh >> 2) & 3) << 4),
            (a >> 4) | (((qh >> 4) & 3) << 4), (c >> 4) | (((qh >> 6) & 3) << 4),
        ], axis=-1).reshape(*b.shape, 16, 16) - 32
        d = (_f32(b["d"])[..., None] * _f32(b["scales"]))[..., None]  # [.., 16, 1]
        return (d * _f32(q)).reshape(*b.shape, 256)
    raise AssertionError(qtype)


def dequantize(raw: np.ndarray, qtype: GGMLQuantizationType, n_cols: int) -> np.ndarray:
    """uint8 [rows, row_bytes] -> float32 [rows, n_cols]."""
    _check_supported(qtype)
    if qtype in _FLOAT_TYPES:
        vals = _blocks(raw, _FLOAT_TYPES[qtype], n_cols, 1)
        if qtype == T.BF16:
            return (vals.astype(np.uint32) << 16).view(np.float32)
        return vals.astype(np.float32)
    elems = GGML_QUANT_SIZES[qtype][0]
    b = _blocks(raw, WEIGHT_LAYOUTS[qtype], n_cols, elems)
    return _dequantize_blocks(b, qtype).reshape(raw.shape[0], n_cols)


def _random_f16(rng: np.random.Generator, shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(np.float16)


def random_quant_matrix(qtype: GGMLQuantizationType, n_rows: int, n_cols: int,
                        rng: np.random.Generator) -> QuantMatrix:
    """Random but valid weights, with scales of the size real models have (|w| ~ 0.01-0.1)."""
    nbytes = row_bytes(qtype, n_cols)
    if qtype in _FLOAT_TYPES:
        w = rng.normal(0.0, 0.05, size=(n_rows, n_cols)).astype(np.float32)
        if qtype == T.F16:
            w = w.astype(np.float16)
        elif qtype == T.BF16:
            w = (w.view(np.uint32) >> 16).astype(np.uint16)
        raw = w.view(np.uint8).reshape(n_rows, nbytes)
        return QuantMatrix(np.ascontiguousarray(raw), qtype, n_rows, n_cols)
    layout = WEIGHT_LAYOUTS[qtype]
    nb = n_cols // GGML_QUANT_SIZES[qtype][0]
    raw = rng.integers(0, 256, size=(n_rows, nbytes), dtype=np.uint8)  # bits: any value is valid
    b = raw.view(layout)  # [n_rows, nb], writes go through to raw
    shape = (n_rows, nb)
    if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        levels = {T.Q4_0: 8, T.Q4_1: 16, T.Q5_0: 16, T.Q5_1: 32, T.Q8_0: 127}[qtype]
        b["d"] = _random_f16(rng, shape, 0.02 / levels, 0.1 / levels)
        if qtype in (T.Q4_1, T.Q5_1):  # the block's minimum: about -d * levels / 2
            b["m"] = (-b["d"].astype(np.float32) * levels / 2
                      * rng.uniform(0.8, 1.2, size=shape)).astype(np.float16)
    elif qtype in (T.Q4_K, T.Q5_K):
        levels = 16 if qtype == T.Q4_K else 32
        b["d"] = _random_f16(rng, shape, 0.05 / levels / 63, 0.15 / levels / 63)
        b["dmin"] = _random_f16(rng, shape, 0.02 / 63, 0.06 / 63)
    else:  # Q6_K
        b["d"] = _random_f16(rng, shape, 0.05 / 32 / 127, 0.1 / 32 / 127)
    return QuantMatrix(raw, qtype, n_rows, n_cols)


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
    layout, elems = _activation_layout(act)
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
    layout, elems = _activation_layout(act)
    b = _blocks(np.asarray(blocks), layout, n_cols, elems)
    return (_f32(b["d"])[..., None] * _f32(b["qs"])).reshape(blocks.shape[0], n_cols)
