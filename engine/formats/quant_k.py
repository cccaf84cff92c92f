"""The K-quant block types (super-blocks of 256 values): layouts, numpy dequantization and
realistic random blocks (for tests and benchmarks). engine.formats.quants holds each type's record.

All multi-byte fields are little-endian; "f16" is IEEE half.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.formats.quant_legacy import random_f16

# Q2_K, 84 bytes: u8 scales[16] | u8 qs[64] | f16 d | f16 dmin
#   16 sub-blocks of 16, scales[j] = sc | mn << 4 (4 bits each); value i (h = i // 128,
#   j = i % 128 // 32, l = i % 32): q = qs[32h + l] >> 2j & 3,
#   value = d * sc[i // 16] * q - dmin * mn[i // 16]
Q2_K = np.dtype([("scales", "u1", (16,)), ("qs", "u1", (64,)), ("d", "<f2"), ("dmin", "<f2")])
# Q3_K, 110 bytes: u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d
#   the 2 low bits as in Q2_K; bit 4h + j of hmask[l] is the third: q = low2 - (bit ? 0 : 4);
#   16 6-bit scales (see q3_k_scales), value = d * (sc[i // 16] - 32) * q
Q3_K = np.dtype([("hmask", "u1", (32,)), ("qs", "u1", (64,)), ("scales", "u1", (12,)), ("d", "<f2")])
# Q4_K, 144 bytes: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
#   8 sub-blocks of 32 with 6-bit scale sc[j] and min mn[j] packed in `scales` (see
#   k_scales_mins); qs holds 4 chunks of 32 bytes: chunk c's low nibbles are sub-block 2c, its
#   high nibbles sub-block 2c+1.  value = d * sc[j] * q - dmin * mn[j]
Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
# Q5_K, 176 bytes: f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
#   as Q4_K, plus a 5th bit: element l of sub-block j takes bit j of qh[l]
Q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qh", "u1", (32,)),
                 ("qs", "u1", (128,))])
# Q6_K, 210 bytes: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
#   two halves of 128 values, each from ql[64h:64h+64], qh[32h:32h+32]; for l < 32:
#     q[l]    = ql[l] & 0xF      | (qh[l] >> 0 & 3) << 4      q[l+64] = ql[l] >> 4    | (qh[l] >> 4 & 3) << 4
#     q[l+32] = ql[l+32] & 0xF   | (qh[l] >> 2 & 3) << 4      q[l+96] = ql[l+32] >> 4 | (qh[l] >> 6 & 3) << 4
#   value i = d * scales[i // 16] * (q[i] - 32)
Q6_K = np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")])


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """u8 [..., 12] -> (sc, mn) u8 [..., 8]: the 6-bit scales and mins of Q4_K/Q5_K.

    Bytes 0..3 hold sc[0..3] in their low 6 bits, bytes 4..7 mn[0..3]; byte 8+j holds the low
    4 bits of sc[4+j] (low nibble) and mn[4+j] (high nibble), whose top 2 bits are the top bits
    of bytes j (sc) and 4+j (mn).
    """
    lo, mid, hi = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def _low2(qs: np.ndarray) -> np.ndarray:
    """u8 [..., 64] -> u8 [..., 256]: Q2_K/Q3_K's 2-bit fields in value order."""
    q = qs.reshape(*qs.shape[:-1], 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]  # [.., 2, 4, 32]
    return (q & 3).reshape(*qs.shape[:-1], 256)


def dequantize_q2_k(b: np.ndarray) -> np.ndarray:
    q = _low2(b["qs"]).reshape(*b.shape, 16, 16)
    d = (_f32(b["d"])[..., None] * _f32(b["scales"] & 0x0F))[..., None]   # [.., 16, 1]
    m = (_f32(b["dmin"])[..., None] * _f32(b["scales"] >> 4))[..., None]
    return (d * _f32(q) - m).reshape(*b.shape, 256)


def q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """u8 [..., 12] -> i8 [..., 16]: Q3_K's signed sub-block scales (6 bits, minus 32).

    Scale k's low 4 bits are byte k % 8's low (k < 8) or high nibble; its top 2 bits are bits
    2 * (k // 4) of byte 8 + k % 4.
    """
    low = np.concatenate([scales[..., :8] & 0x0F, scales[..., :8] >> 4], axis=-1)
    top = (scales[..., 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3   # [.., byte, shift]
    top = np.swapaxes(top, -1, -2).reshape(*scales.shape[:-1], 16)
    return ((low | (top << 4)).astype(np.int16) - 32).astype(np.int8)


def dequantize_q3_k(b: np.ndarray) -> np.ndarray:
    high = (b["hmask"][..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [.., 8, 32]
    q = _low2(b["qs"]).astype(np.int8) - 4 * (1 - high.reshape(*b.shape, 256).astype(np.int8))
    d = (_f32(b["d"])[..., None] * _f32(q3_k_scales(b["scales"])))[..., None]  # [.., 16, 1]
    return (d * _f32(q.reshape(*b.shape, 16, 16))).reshape(*b.shape, 256)


def dequantize_q4_5_k(b: np.ndarray) -> np.ndarray:
    """Q4_K or Q5_K (whichever b's layout is): structured [rows, nb] -> float32 [rows, nb, 256]."""
    sc, mn = k_scales_mins(b["scales"])  # [rows, nb, 8]
    qs = b["qs"].reshape(*b.shape, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(*b.shape, 8, 32)
    if "qh" in (b.dtype.names or ()):  # Q5_K
        qh = b["qh"][..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]  # [.., 8, 32]
        q = q | ((qh & 1) << 4)
    d = (_f32(b["d"])[..., None] * _f32(sc))[..., None]
    m = (_f32(b["dmin"])[..., None] * _f32(mn))[..., None]
    return (d * _f32(q) - m).reshape(*b.shape, 256)


def dequantize_q6_k(b: np.ndarray) -> np.ndarray:
    ql = b["ql"].reshape(*b.shape, 2, 64).astype(np.int32)
    qh = b["qh"].reshape(*b.shape, 2, 32).astype(np.int32)
    a, c = ql[..., :32], ql[..., 32:]
    q = np.concatenate([
        (a & 0xF) | ((qh & 3) << 4), (c & 0xF) | (((qh >> 2) & 3) << 4),
        (a >> 4) | (((qh >> 4) & 3) << 4), (c >> 4) | (((qh >> 6) & 3) << 4),
    ], axis=-1).reshape(*b.shape, 16, 16) - 32
    d = (_f32(b["d"])[..., None] * _f32(b["scales"]))[..., None]  # [.., 16, 1]
    return (d * _f32(q)).reshape(*b.shape, 256)


def random_scales(levels: int) -> Callable[[np.ndarray, np.random.Generator], None]:
    """Set d and dmin of random Q4_K/Q5_K super-blocks so that |w| ~ 0.01-0.1 with their random
    6-bit sub-block scales; `levels` is the number of quant steps."""

    def fill(b: np.ndarray, rng: np.random.Generator) -> None:
        b["d"] = random_f16(rng, b.shape, 0.05 / levels / 63, 0.15 / levels / 63)
        b["dmin"] = random_f16(rng, b.shape, 0.02 / 63, 0.06 / 63)

    return fill


def random_q2_k_scales(b: np.ndarray, rng: np.random.Generator) -> None:
    """d and dmin for random Q2_K blocks (4-bit scales and mins, quants 0..3)."""
    b["d"] = random_f16(rng, b.shape, 0.05 / 3 / 15, 0.15 / 3 / 15)
    b["dmin"] = random_f16(rng, b.shape, 0.02 / 15, 0.06 / 15)


def random_q3_k_scales(b: np.ndarray, rng: np.random.Generator) -> None:
    """d for random Q3_K blocks (signed 6-bit scales, quants -4..3)."""
    b["d"] = random_f16(rng, b.shape, 0.05 / 4 / 32, 0.1 / 4 / 32)


def random_q6_k_scales(b: np.ndarray, rng: np.random.Generator) -> None:
    """d for random Q6_K blocks (signed 8-bit sub-block scales, quants -32..31)."""
    b["d"] = random_f16(rng, b.shape, 0.05 / 32 / 127, 0.1 / 32 / 127)
