"""The element types a KV cache row may be stored in (llama.cpp's -ctk / -ctv), and their rows.

    f16   2 bytes a value                        (the default)
    q8_0  34 bytes per 32 values: f16 d | i8 qs[32]          value = d * q
    q4_0  18 bytes per 32 values: f16 d | u8 qs[16] nibbles  value = d * (q - 8)

A row is one (position, kv head): head_dim values, a whole number of blocks (head dims are
multiples of 32 in every family served), so a block never spans two heads and a head's row is
`row_bytes` contiguous bytes, as in llama.cpp's cache tensors. Types are named as llama.cpp's
command line names them, or by their ggml type number as llama-cpp-python's `type_k`/`type_v`
take them (1 = f16, 8 = q8_0, 2 = q4_0).

The quantizers are ggml's reference ones (quantize_row_q8_0_ref / _q4_0_ref), what llama.cpp
uses when it copies a new key or value into a quantized cache; `quantize_rows` and
`dequantize_rows` are the numpy twins the attention kernels' tests trust.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.formats.activations import quantize_activations
from engine.formats.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType
from engine.formats.quant_legacy import Q4_0, Q8_0, dequantize_q8_0, dequantizer

T = GGMLQuantizationType


@dataclass(frozen=True)
class KVType:
    name: str     # llama.cpp's -ctk/-ctv name
    ggml: int     # ggml type number (llama-cpp-python's type_k/type_v)
    block: int    # values per block
    block_bytes: int

    @property
    def quantized(self) -> bool:
        return self.name != "f16"

    def row_bytes(self, n: int) -> int:
        """Bytes of n values (one head's row: n = head_dim)."""
        if n <= 0 or n % self.block:
            raise ValueError(f"a {self.name} KV row needs a positive multiple of {self.block} "
                             f"values, got {n}")
        return n // self.block * self.block_bytes


KV_TYPES: dict[str, KVType] = {t.name: t for t in (
    KVType("f16", int(T.F16), *GGML_QUANT_SIZES[T.F16]),
    KVType("q8_0", int(T.Q8_0), *GGML_QUANT_SIZES[T.Q8_0]),
    KVType("q4_0", int(T.Q4_0), *GGML_QUANT_SIZES[T.Q4_0]),
)}
F16 = KV_TYPES["f16"]
_BY_NUMBER = {t.ggml: t for t in KV_TYPES.values()}


def kv_type(value: str | int | KVType) -> KVType:
    """A KV type by llama.cpp's name (any case) or ggml number; ValueError naming the choices."""
    if isinstance(value, KVType):
        return value
    if isinstance(value, int) and not isinstance(value, bool):  # True is no type number
        if value in _BY_NUMBER:
            return _BY_NUMBER[value]
    elif isinstance(value, str) and value.strip().lower() in KV_TYPES:
        return KV_TYPES[value.strip().lower()]
    choices = ", ".join(f"{t.name} ({t.ggml})" for t in KV_TYPES.values())
    raise ValueError(f"unsupported KV cache type {value!r}; supported: {choices}")


def quantize_rows(x: np.ndarray, t: KVType) -> np.ndarray:
    """float32 [..., n] -> the rows stored: float16 [..., n] for f16, else uint8
    [..., row_bytes(n)] of ggml blocks (ggml's reference quantizers)."""
    x = np.asarray(x, dtype=np.float32)
    if t.name == "f16":
        return x.astype(np.float16)
    lead, n = x.shape[:-1], x.shape[-1]
    t.row_bytes(n)
    flat = x.reshape(-1, n)
    # q8_0: ggml's reference rounding, as the activation quantizer has it
    out = quantize_activations(flat, "q8_0") if t.name == "q8_0" else _quantize_q4_0(flat)
    return out.reshape(*lead, t.row_bytes(n))


def _quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8, q = min(15,
    trunc(x / d + 8.5)), two values a byte (value j low nibble, j + 16 high)."""
    rows, n = x.shape
    xb = x.reshape(rows, n // 32, 32)
    idx = np.abs(xb).argmax(axis=-1)[..., None]
    d = np.take_along_axis(xb, idx, axis=-1)[..., 0] / np.float32(-8)       # [rows, nb]
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(np.float32(15), np.trunc(xb * inv[..., None] + np.float32(8.5))).astype(np.uint8)
    out = np.zeros((rows, n // 32), dtype=Q4_0)
    out["d"] = d.astype(np.float16)
    out["qs"] = q[..., :16] | (q[..., 16:] << 4)
    return out.view(np.uint8).reshape(rows, -1)


def dequantize_rows(rows: np.ndarray, t: KVType, n: int) -> np.ndarray:
    """The stored rows back as float32 [..., n] (what a kernel reading them computes with)."""
    if t.name == "f16":
        return np.asarray(rows).astype(np.float32)
    lead = rows.shape[:-1]
    layout = Q8_0 if t.name == "q8_0" else Q4_0
    blocks = np.ascontiguousarray(rows).reshape(-1, t.row_bytes(n)).view(layout)  # [R, nb]
    values = dequantize_q8_0(blocks) if t.name == "q8_0" else dequantizer(-8)(blocks)
    return values.reshape(*lead, n).astype(np.float32)
