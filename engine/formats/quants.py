"""Weight tensor types, each described once, and weights kept in their quantized blocks.

TYPES holds one record (QuantType) per supported weight type: its block layout (a numpy
structured dtype, so `raw.view(layout)` turns a uint8 row into blocks with named fields), the
activation format the matmul kernels quantize x to, its numpy dequantization (the kernels' twin,
checked against gguf-py), how to make realistic random blocks, and which kernel tile family of
engine/kernels/matmul/ computes with it. Adding a type is one record here (plus its family's
code if no existing family fits). Layouts and dequantizers live per family in quant_legacy.py,
quant_k.py, quant_iq.py, quant_mx.py; the activation formats in activations.py.

The matmul kernels never dequantize weights: they quantize the activations to 8-bit blocks
(q8_0 / q8_1 / q8_k, ggml's scheme, engine.formats.activations) and take integer dot products.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.formats import quant_iq, quant_k, quant_legacy, quant_mx

# re-exported (`X as X`): the activation half of the format
from engine.formats.activations import (
    ACTIVATION_BLOCK as ACTIVATION_BLOCK,
)
from engine.formats.activations import (
    ACTIVATION_LAYOUTS as ACTIVATION_LAYOUTS,
)
from engine.formats.activations import (
    Q8_0_ACT as Q8_0_ACT,
)
from engine.formats.activations import (
    Q8_1_ACT as Q8_1_ACT,
)
from engine.formats.activations import (
    Q8_K_ACT as Q8_K_ACT,
)
from engine.formats.activations import (
    activation_row_bytes as activation_row_bytes,
)
from engine.formats.activations import (
    dequantize_activations as dequantize_activations,
)
from engine.formats.activations import (
    empty_packed as empty_packed,
)
from engine.formats.activations import (
    pack_activations as pack_activations,
)
from engine.formats.activations import (
    packed_activation_bytes as packed_activation_bytes,
)
from engine.formats.activations import (
    quantize_activations as quantize_activations,
)
from engine.formats.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType

_Blocks = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class QuantType:
    """Everything the engine knows about one weight type.

    kernel names the tile family that engine.kernels.matmul.build.FAMILIES builds the matmul
    with: "float" (f32 activations, FMA), "legacy" (32-value blocks against packed q8_0/q8_1),
    "q2_k", "q3_k", "q4_5_k", "q6_k", "iq4_xs" (super-blocks against q8_k). IQ4_NL and MXFP4
    are legacy types with a codebook: the Q8_0 path after one lookup (MXFP4's scale an E8M0
    byte rather than an f16).
    """
    qtype: GGMLQuantizationType
    layout: np.dtype        # one block (float types: one value)
    act: str | None         # activation block format the kernels take; None: f32 activations
    dequantize: _Blocks     # blocks [rows, nb] (layout) -> float32 [rows, nb, block_elems]
    random_scales: Callable[[np.ndarray, np.random.Generator], None] | None  # None: float type
    kernel: str             # tile family in engine.kernels.matmul.build.FAMILIES
    group: int = 1          # blocks the kernel folds in per loop step
    zero: int = 0           # legacy 4/5-bit without a min: value = d * (q + zero)
    codebook: tuple[int, ...] | None = None  # 4-bit index -> signed 8-bit value (IQ4_*, MXFP4)
    scale: str = "f16"      # how a block's scale is stored: "f16" d at offset 0, or
    #                         quant_mx.SCALE_E8M0_HALF (MXFP4's e: 2^(e - 128))

    @property
    def name(self) -> str:
        return self.qtype.name

    @property
    def block_elems(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def block_bytes(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][1]

    def offset(self, field: str) -> int:
        """Byte offset of a field in the block."""
        fields = self.layout.fields
        assert fields is not None, "block layouts are structured dtypes"
        return int(fields[field][1])

    def has(self, field: str) -> bool:
        return field in (self.layout.names or ())


def _floats(b: np.ndarray) -> np.ndarray:
    return b.astype(np.float32)[..., None]


def _bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)[..., None]  # the top half of an f32


# llama.cpp pairs Q4_0/Q5_0 with q8_0; we give them q8_1 (same q and d), whose block sum
# lets the kernel keep the weights unsigned (q * y, then - 8 * d * s) instead of sign-flipping
# both operands: about 25% faster; s's f16 rounding adds noise of the size d's rounding has.
# Legacy types fold two blocks per loop step (K-quant blocks are long enough alone).
_TYPES = [
    QuantType(T.F32, np.dtype("<f4"), None, _floats, None, "float"),
    QuantType(T.F16, np.dtype("<f2"), None, _floats, None, "float"),
    QuantType(T.BF16, np.dtype("<u2"), None, _bf16, None, "float"),
    QuantType(T.Q4_0, quant_legacy.Q4_0, "q8_1", quant_legacy.dequantizer(-8),
              quant_legacy.random_scales(8), "legacy", group=2, zero=-8),
    QuantType(T.Q4_1, quant_legacy.Q4_1, "q8_1", quant_legacy.dequantizer(0),
              quant_legacy.random_scales(16), "legacy", group=2),
    QuantType(T.Q5_0, quant_legacy.Q5_0, "q8_1", quant_legacy.dequantizer(-16),
              quant_legacy.random_scales(16), "legacy", group=2, zero=-16),
    QuantType(T.Q5_1, quant_legacy.Q5_1, "q8_1", quant_legacy.dequantizer(0),
              quant_legacy.random_scales(32), "legacy", group=2),
    QuantType(T.Q8_0, quant_legacy.Q8_0, "q8_0", quant_legacy.dequantize_q8_0,
              quant_legacy.random_scales(127), "legacy", group=2),
    QuantType(T.IQ4_NL, quant_iq.IQ4_NL, "q8_0", quant_iq.dequantize_iq4_nl,
              quant_iq.random_iq4_nl_scales, "legacy", group=2, codebook=quant_iq.CODEBOOK),
    QuantType(T.MXFP4, quant_mx.MXFP4, "q8_0", quant_mx.dequantize_mxfp4,
              quant_mx.random_mxfp4_scales, "legacy", group=2, codebook=quant_mx.CODEBOOK,
              scale=quant_mx.SCALE_E8M0_HALF),
    QuantType(T.Q2_K, quant_k.Q2_K, "q8_k", quant_k.dequantize_q2_k,
              quant_k.random_q2_k_scales, "q2_k"),
    QuantType(T.Q3_K, quant_k.Q3_K, "q8_k", quant_k.dequantize_q3_k,
              quant_k.random_q3_k_scales, "q3_k"),
    QuantType(T.Q4_K, quant_k.Q4_K, "q8_k", quant_k.dequantize_q4_5_k,
              quant_k.random_scales(16), "q4_5_k"),
    QuantType(T.Q5_K, quant_k.Q5_K, "q8_k", quant_k.dequantize_q4_5_k,
              quant_k.random_scales(32), "q4_5_k"),
    QuantType(T.Q6_K, quant_k.Q6_K, "q8_k", quant_k.dequantize_q6_k,
              quant_k.random_q6_k_scales, "q6_k"),
    QuantType(T.IQ4_XS, quant_iq.IQ4_XS, "q8_k", quant_iq.dequantize_iq4_xs,
              quant_iq.random_iq4_xs_scales, "iq4_xs", codebook=quant_iq.CODEBOOK),
]
TYPES: dict[GGMLQuantizationType, QuantType] = {t.qtype: t for t in _TYPES}
SUPPORTED: frozenset[GGMLQuantizationType] = frozenset(TYPES)

for _t in _TYPES:  # the layouts agree with the format's table
    assert _t.block_bytes == _t.layout.itemsize, _t.name
    assert _t.act is None or ACTIVATION_BLOCK[_t.act] == _t.block_elems, _t.name


def quant_type(qtype: GGMLQuantizationType) -> QuantType:
    """The record of a supported type; a clear ValueError for any other."""
    t = TYPES.get(qtype)
    if t is None:
        name = getattr(qtype, "name", repr(qtype))
        raise ValueError(f"unsupported tensor type {name}; supported: "
                         f"{', '.join(sorted(t.name for t in SUPPORTED))}")
    return t


def block_size(qtype: GGMLQuantizationType) -> tuple[int, int]:
    """(values per block, bytes per block) of a supported type."""
    t = quant_type(qtype)
    return t.block_elems, t.block_bytes


def row_bytes(qtype: GGMLQuantizationType, n_cols: int) -> int:
    """Bytes in one row of `n_cols` values; n_cols must be a whole number of blocks."""
    elems, nbytes = block_size(qtype)
    if n_cols <= 0 or n_cols % elems:
        raise ValueError(f"{qtype.name} rows need a positive multiple of {elems} values, got {n_cols}")
    return n_cols // elems * nbytes


def activation_type(qtype: GGMLQuantizationType) -> str | None:
    """Format the kernels quantize activations to for this weight type (None: f32 activations)."""
    return quant_type(qtype).act


class HostMatrix:
    """What the kernels take of a matrix held as one uint8 array in host memory (`_bytes()`):
    the address of its first byte, as an integer computed once, and its size."""

    def _bytes(self) -> np.ndarray:
        raise NotImplementedError

    @functools.cached_property
    def address(self) -> int:
        return int(self._bytes().ctypes.data)

    @property
    def nbytes(self) -> int:
        return int(self._bytes().nbytes)


@dataclass(frozen=True, eq=False)
class QuantMatrix(HostMatrix):
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

    def _bytes(self) -> np.ndarray:
        return self.raw


@dataclass(frozen=True, eq=False)
class StackedMatrix:
    """n_mat matrices of one shape and type in one array: llama.cpp's 3-D ffn_*_exps, one
    matrix per expert. matrix(e) is expert e as a QuantMatrix, a view (no copy), so the matmul
    kernels take it as any other matrix; its bytes start at address + e * matrix_bytes."""

    raw: np.ndarray  # uint8 [n_mat, n_rows, row_bytes], C-contiguous (a view into the mmap)
    qtype: GGMLQuantizationType
    n_mat: int
    n_rows: int
    n_cols: int

    def __post_init__(self) -> None:
        expected = (self.n_mat, self.n_rows, row_bytes(self.qtype, self.n_cols))
        if not isinstance(self.raw, np.ndarray) or self.raw.dtype != np.uint8:
            raise ValueError("StackedMatrix.raw must be a uint8 numpy array")
        if self.raw.shape != expected or not self.raw.flags.c_contiguous:
            raise ValueError(f"{self.qtype.name} {self.n_mat}x{self.n_rows}x{self.n_cols} needs "
                             f"C-contiguous raw of shape {expected}, got {self.raw.shape}")

    @functools.cached_property
    def matrices(self) -> tuple[QuantMatrix, ...]:
        return tuple(QuantMatrix(self.raw[e], self.qtype, self.n_rows, self.n_cols)
                     for e in range(self.n_mat))

    def matrix(self, e: int) -> QuantMatrix:
        return self.matrices[e]

    @functools.cached_property
    def address(self) -> int:
        return int(self.raw.ctypes.data)

    @property
    def matrix_bytes(self) -> int:
        """The stride from one matrix to the next."""
        return int(self.raw[0].nbytes)


def blocks(raw: np.ndarray, qtype: GGMLQuantizationType, n_cols: int) -> np.ndarray:
    """uint8 [rows, row_bytes] -> structured [rows, n_blocks] in the type's layout."""
    t = quant_type(qtype)
    if raw.dtype != np.uint8 or raw.ndim != 2:
        raise ValueError(f"expected a 2-D uint8 array of blocks, got {raw.dtype} {raw.shape}")
    if n_cols <= 0 or n_cols % t.block_elems or raw.shape[1] != n_cols // t.block_elems * t.block_bytes:
        raise ValueError(f"{raw.shape[1]} bytes per row do not hold {n_cols} values "
                         f"in blocks of {t.block_elems} / {t.block_bytes} bytes")
    return np.ascontiguousarray(raw).view(t.layout)


def dequantize(raw: np.ndarray, qtype: GGMLQuantizationType, n_cols: int) -> np.ndarray:
    """uint8 [rows, row_bytes] -> float32 [rows, n_cols]."""
    b = blocks(raw, qtype, n_cols)
    return TYPES[qtype].dequantize(b).reshape(raw.shape[0], n_cols)


def random_quant_matrix(qtype: GGMLQuantizationType, n_rows: int, n_cols: int,
                        rng: np.random.Generator) -> QuantMatrix:
    """Random but valid weights, with scales of the size real models have (|w| ~ 0.01-0.1)."""
    t = quant_type(qtype)
    nbytes = row_bytes(qtype, n_cols)
    if t.random_scales is None:  # a float type
        w = rng.normal(0.0, 0.05, size=(n_rows, n_cols)).astype(np.float32)
        if qtype == T.F16:
            w = w.astype(np.float16)
        elif qtype == T.BF16:
            w = (w.view(np.uint32) >> 16).astype(np.uint16)
        raw = w.view(np.uint8).reshape(n_rows, nbytes)
        return QuantMatrix(np.ascontiguousarray(raw), qtype, n_rows, n_cols)
    raw = rng.integers(0, 256, size=(n_rows, nbytes), dtype=np.uint8)  # bits: any value is valid
    t.random_scales(raw.view(t.layout), rng)  # [n_rows, nb]; writes go through to raw
    return QuantMatrix(raw, qtype, n_rows, n_cols)
