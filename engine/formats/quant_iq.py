"""The non-linear 4-bit types IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256): layouts,
numpy dequantization and realistic random blocks. engine.formats.quants holds each type's record.

Both map each 4-bit index through one fixed 16-entry codebook (ggml's kvalues_iq4nl), so the
weights are signed 8-bit integers times a block scale: the matmul kernels look the indices up
(one byte shuffle) and take the same signed integer dot products as Q8_0.
"""
from __future__ import annotations

import numpy as np

from engine.formats.quant_legacy import nibbles, random_f16

CODEBOOK = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_CODES = np.array(CODEBOOK, np.int8)

# IQ4_NL, 32 values, 18 bytes: f16 d | u8 qs[16]
#   value j (j < 16) = d * CODEBOOK[qs[j] & 0xF],  value j + 16 = d * CODEBOOK[qs[j] >> 4]
IQ4_NL = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
# IQ4_XS, 256 values, 136 bytes: f16 d | u16 scales_h | u8 scales_l[4] | u8 qs[128]
#   8 sub-blocks of 32, each laid out as one IQ4_NL block's qs (qs[16j:16j + 16]); its 6-bit
#   scale ls[j] = (scales_l[j // 2] >> 4 (j % 2) & 0xF) | (scales_h >> 2j & 3) << 4;
#   value = d * (ls[j] - 32) * CODEBOOK[index]
IQ4_XS = np.dtype([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", (4,)), ("qs", "u1", (128,))])


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def dequantize_iq4_nl(b: np.ndarray) -> np.ndarray:
    return _f32(b["d"])[..., None] * _f32(_CODES[nibbles(b["qs"])])


def iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    """structured [...] -> int16 [..., 8]: IQ4_XS's sub-block scales ls - 32."""
    low = (b["scales_l"][..., :, None] >> np.array([0, 4], np.uint8)) & 0x0F  # [.., 4, 2]
    low = low.reshape(*b.shape, 8).astype(np.int16)
    high = (b["scales_h"][..., None] >> np.arange(0, 16, 2, dtype=np.uint16)) & 3  # [.., 8]
    return (low | (high.astype(np.int16) << 4)) - 32


def dequantize_iq4_xs(b: np.ndarray) -> np.ndarray:
    q = _CODES[nibbles(b["qs"].reshape(*b.shape, 8, 16))]  # [.., 8, 32]
    d = (_f32(b["d"])[..., None] * _f32(iq4_xs_scales(b)))[..., None]  # [.., 8, 1]
    return (d * _f32(q)).reshape(*b.shape, 256)


def random_iq4_nl_scales(b: np.ndarray, rng: np.random.Generator) -> None:
    b["d"] = random_f16(rng, b.shape, 0.02 / 127, 0.1 / 127)


def random_iq4_xs_scales(b: np.ndarray, rng: np.random.Generator) -> None:
    b["d"] = random_f16(rng, b.shape, 0.05 / 32 / 127, 0.1 / 32 / 127)
