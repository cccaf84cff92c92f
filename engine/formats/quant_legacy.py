"""The legacy block types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: layouts, numpy dequantization and
realistic random blocks (for tests and benchmarks). engine.formats.quants holds each type's record.

All multi-byte fields are little-endian; "f16" is IEEE half. Blocks hold 32 values.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

# Q4_0, 18 bytes: f16 d | u8 qs[16]
#   value j (j < 16) = d * ((qs[j] & 0xF) - 8),  value j + 16 = d * ((qs[j] >> 4) - 8)
Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
# Q4_1, 20 bytes: f16 d | f16 m | u8 qs[16]
#   value = d * nibble + m, nibbles ordered as in Q4_0 (no -8 offset)
Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])
# Q5_0, 22 bytes: f16 d | u32 qh | u8 qs[16]
#   5-bit q_j = nibble_j | (bit j of qh) << 4, value = d * (q_j - 16)
Q5_0 = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
# Q5_1, 24 bytes: f16 d | f16 m | u32 qh | u8 qs[16];  value = d * q_j + m
Q5_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
# Q8_0, 34 bytes: f16 d | i8 qs[32];  value = d * qs[j]
Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """u8 [..., 16] -> u8 [..., 32]: low nibbles are values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits32(qh: np.ndarray) -> np.ndarray:
    """u32 [...] -> u8 [..., 32]: bit j of each word."""
    return ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def dequantizer(zero: int) -> Callable[[np.ndarray], np.ndarray]:
    """structured [rows, nb] -> float32 [rows, nb, 32] for a 4- or 5-bit type: d * (q + zero),
    plus m where the layout has one (Q4_1, Q5_1)."""

    def dequantize(b: np.ndarray) -> np.ndarray:
        q = nibbles(b["qs"]).astype(np.int32)  # [rows, nb, 32]
        if "qh" in (b.dtype.names or ()):
            q |= _bits32(b["qh"]).astype(np.int32) << 4
        d = _f32(b["d"])[..., None]
        if "m" in (b.dtype.names or ()):
            return d * _f32(q) + _f32(b["m"])[..., None]
        return d * _f32(q + zero)

    return dequantize


def dequantize_q8_0(b: np.ndarray) -> np.ndarray:
    return _f32(b["d"])[..., None] * _f32(b["qs"])


def random_f16(rng: np.random.Generator, shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(np.float16)


def random_scales(levels: int) -> Callable[[np.ndarray, np.random.Generator], None]:
    """Set d (and m) of random blocks so that |w| ~ 0.01-0.1, as in real models; `levels` is
    how many steps of d the quants span on each side of the block's zero."""

    def fill(b: np.ndarray, rng: np.random.Generator) -> None:
        b["d"] = random_f16(rng, b.shape, 0.02 / levels, 0.1 / levels)
        if "m" in (b.dtype.names or ()):  # the block's minimum: about -d * levels / 2
            b["m"] = (-b["d"].astype(np.float32) * levels / 2
                      * rng.uniform(0.8, 1.2, size=b.shape)).astype(np.float16)

    return fill
