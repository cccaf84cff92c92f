"""MXFP4 (ggml type 39, OCP microscaling FP4): layout, numpy dequantization and realistic random
blocks. engine.formats.quants holds its record.

Each value is an E2M1 float (4 bits: sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2,
3, 4, 6 and their negatives) and each block of 32 shares an E8M0 scale (a bare power of two,
2^(e - 127)). ggml stores the E2M1 values doubled (CODEBOOK, its kvalues_mxfp4: integers) and
halves the scale instead, so a value is an 8-bit integer times a block scale, as IQ4_NL's: the
matmul kernels look the indices up (one byte shuffle) and take Q8_0's signed integer dot
products; only the scale is read differently (SCALE_E8M0_HALF).
"""
from __future__ import annotations

import numpy as np

from engine.formats.quant_legacy import nibbles

CODEBOOK = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # 2 * E2M1(index)
_CODES = np.array(CODEBOOK, np.int8)

# MXFP4, 32 values, 17 bytes: u8 e | u8 qs[16]
#   value j (j < 16) = 2^(e - 128) * CODEBOOK[qs[j] & 0xF], value j + 16: qs[j] >> 4
MXFP4 = np.dtype([("e", "u1"), ("qs", "u1", (16,))])

SCALE_E8M0_HALF = "e8m0_half"  # the scale kind of MXFP4's record: 2^(e - 128) from one byte


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """u8 [...] -> float32 [...]: 2^(e - 128), ggml's GGML_E8M0_TO_FP32_HALF (e < 2 are f32
    subnormals, written as their bits as ggml does)."""
    e32 = e.astype(np.uint32)
    bits = np.where(e32 < 2, np.uint32(0x00200000) << e32, (e32 - 1) << 23).astype(np.uint32)
    values: np.ndarray = bits.view(np.float32)
    return values


def dequantize_mxfp4(b: np.ndarray) -> np.ndarray:
    values: np.ndarray = e8m0_half(b["e"])[..., None] * _CODES[nibbles(b["qs"])].astype(np.float32)
    return values


def random_mxfp4_scales(b: np.ndarray, rng: np.random.Generator) -> None:
    """Scales 2^-9 .. 2^-6: with the codebook's rms of 5.9, |w| ~ 0.01-0.09."""
    b["e"] = rng.integers(119, 123, size=b.shape, dtype=np.uint8)
