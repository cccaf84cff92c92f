"""Weights repacked for the row-interleaved kernels (engine.kernels.gemm), and their activations.

The kernels take 16 weight rows at once, one row per 32-bit lane of a 512-bit vector: each
`vpdpbusd` multiplies 4 bytes of every row with the same 4 activation bytes (broadcast) and adds
the four products into that row's lane. So a block's integer dot product is complete in its lane
and is scaled once per block, for 16 rows with one vector FMA: far less float work per
multiply-add than the file's row-by-row layout allows, and each activation load serves 16 rows.
Repacking happens once at load (the repacked copy replaces the file's mapping for matmuls; the
memory estimate counts it), by compiled code (engine.kernels.gemm.repack_ir) where the type has
it; the numpy repacking here is its twin. Rows come in groups of 16; a group's blocks follow each other, each
block holding its 16 rows' data side by side:

    Q8_0 (544 bytes = 16 x 34):  qs  u8 [8 chunks][16 rows][4]   q + 128, chunk c = values 4c..4c+3
                                 d   f16 [16]
    Q4_0 (288 = 16 x 18):        qs  u8 [4][16][4]   as Q5_0's | d f16 [16]
    IQ4_NL (288):                as Q4_0, its nibbles indices into the codebook
    Q5_0 (352 = 16 x 22):        qs  u8 [4][16][4]   ggml's qs bytes 4k..4k+3: low nibbles are
                                     values 4k.. (chunk k), high nibbles 16+4k.. (chunk k+4)
                                 qh  u32 [16]        bit j: the 5th bit of value j
                                 d   f16 [16]
    Q4_1 (320 = 16 x 20):        qs as Q5_0 | d f16 [16] | m f16 [16]
    Q5_1 (384 = 16 x 24):        qs as Q5_0 | qh u32 [16] | d f16 [16] | m f16 [16]
    Q4_K (2368 = 16 x 144 + 64): d, dmin  f16 [16] each
                                 sc  u8 [8 sub-blocks][16]        the 6-bit scales
                                 mn  u8 [8 sub-blocks][16]        the 6-bit mins
                                 qs  u8 [4 pairs][8 chunks][16][4]  ggml's qs bytes 32p+4c..+3:
                                     low nibbles are sub-block 2p's values 4c.., high 2p+1's
    Q5_K (2880 = 16 x 176 + 64): d, dmin, sc, mn as Q4_K
                                 qh  u8 [8 chunks][16][4]   ggml's qh bytes 4c..4c+3: bit j is
                                     the 5th bit of sub-block j's values 4c..4c+3
                                 qs  as Q4_K
    Q6_K (3360 = 16 x 210):      d   f16 [16]
                                 sc  i8 [16 sub-blocks][16]
                                 8 steps s, each  ql u8 [4][16][4] | qh u8 [2][16][4]:
                                     ql's low nibble: 4 bits of chunk 4s+i, high: of 32+4s+i;
                                     qh's 2-bit fields k = 0..3: top bits of chunks 4s+2p,
                                     4s+2p+1, 32+4s+2p, 32+4s+2p+1 (the order the kernel reads)
    Q2_K (1600 = 16 x 84 + 256): d, dmin  f16 [16] each
                                 sc, mn  u8 [16 sub-blocks][16] each   (the 4-bit halves)
                                 qs  u8 [2 halves][8 chunks][16][4]  ggml's qs bytes
                                     32h+4c..+3: bits 2j.. are values 128h+32j+4c..+3
    Q3_K (1824 = 16 x 110 + 64): d   f16 [16]
                                 sc  i8 [16 sub-blocks][16]        the 6-bit scales - 32
                                 hm  u8 [8 chunks][16][4]   ggml's hmask bytes 4c..4c+3
                                 qs  as Q2_K's
    IQ4_XS (2208 = 16 x 136 + 32):  d   f16 [16]
                                 sc  i8 [8 sub-blocks][16]        ls - 32, the 6-bit scales
                                 qs  u8 [8 sub-blocks][4][16][4]  each as an IQ4_NL block's
    (Q6_K chunk c = values 4c..4c+3 of the 256; sub-block j = chunks 4j..4j+3.)

Activations, per row (row stride a multiple of 64 bytes), quantized exactly as ggml's q8_0 /
q8_k blocks (engine.formats.quants.quantize_activations gives the same values):
    r8_0 (Q8_0):        qs i8 [K] | d f32 [nb] (ggml's f16 d, widened) | c i32 [nb] = -128 * sum(qs)
    r8_1 (Q4_1, Q5_1):  qs i8 [K] | d f32 [nb] | s f32 [nb]   ggml's q8_1 d and s = d * sum(qs)
    r8_k (K-quants):    qs i8 [K] | d f32 [nb] | c16 i32 [16 nb] = -32 * bsums (per 16 values)
                        | b32 i16 [8 nb] = sums per 32 values
The c fields undo offsets in integers: Q8_0 weights are stored + 128 (vpdpbusd takes them
unsigned), so sum(q * y) = sum((q + 128) * y) - 128 * sum(y); Q6_K's values are q - 32.

Per row r and block b the kernels compute (isum exact in int32):
    Q8_0:  acc = fma(d[r] * dx[b], float(sum q * y), acc)
    IQ4_NL: as Q8_0, with q + 128 = (codebook + 128)[nibble]
    Q4_0, Q5_0:  acc = fma(d[r] * dx[b], float(sum (q - 8 or 16) * y), acc)    (q8_0
           activations, as llama.cpp pairs them; c / 16 = -8 * sum(y) or c / 8 = -16 * sum(y)
           takes the offset off in integers)
    Q4_1, Q5_1:  acc = fma(d[r] * dx[b], float(sum q * y), acc); acc = fma(m[r], s[b], acc)
    Q4_K, Q5_K: acc = fma(float(sum_j sc_j * dot_j), d[r] * dx[b], acc);
           nacc = fma(float(sum_j mn_j * b32_j), -(dmin[r] * dx[b]), nacc); out = acc + nacc
           (llama.cpp's repacked Q4_K on x86, acc - acc_min; matmul.kquants.fold_whole likewise)
    Q6_K:  acc = fma(float(sum_j sc_j * (dot_j - 32 * bsum_j)), d[r] * dx[b], acc), the 16
           sub-blocks summed whole in integers as Q4_K's (kquants.fold_whole likewise)
    Q2_K:  acc = fma(float(sum_g sc_g * dot_g), d[r] * dx[b], acc); nacc = fma(float(sum_g mn_g
           * c16_g), dmin[r] * dx[b] / 32, nacc) (c16 = -32 * bsums); out = acc + nacc
    Q3_K:  acc = fma(float(sum_g sc_g * (dot_g - 4 * bsum_g)), d[r] * dx[b], acc), the 3-bit
           values taken as low2 | hbit << 2 (unsigned), -4 * bsum_g = c16_g >> 3
    IQ4_XS: acc = fma(float(sum_j sc_j * dot_j), d[r] * dx[b], acc) over its 8 sub-blocks, each
           dot_j as IQ4_NL's (the offset -128 * sum(y_j) = 4 * the c16 of its two halves)
    Q4_K, Q5_K and Q6_K give the file-layout kernels' bits (gemm.FILE_LAYOUT_BITS); the file
    layout sums the other super-block types' blocks in 8 lanes, a different rounding.
so the kernels' numpy twin (engine.kernels.gemm.reference) is the exact product of the
dequantized weights and activations up to float32 rounding of those few terms. Each row's
arithmetic is the same whatever M, the thread split or the other rows, as the file-layout
kernels promise.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from engine import hugepages
from engine.formats.activations import (
    ACTIVATION_LAYOUTS,
    quantize_activations,
)
from engine.formats.ggml_types import GGMLQuantizationType
from engine.formats.quant_iq import iq4_xs_scales
from engine.formats.quant_k import q3_k_scales
from engine.formats.quants import HostMatrix, QuantMatrix, StackedMatrix, quant_type, row_bytes

T = GGMLQuantizationType
ROWS = 16  # weight rows per group: the 32-bit lanes of a 512-bit vector
GROUP_BLOCK_BYTES = {T.Q8_0: 544, T.Q4_0: 288, T.IQ4_NL: 288, T.Q5_0: 352, T.Q4_1: 320,
                     T.Q5_1: 384, T.Q2_K: 1600, T.Q3_K: 1824, T.Q4_K: 2368, T.Q5_K: 2880,
                     T.Q6_K: 3360, T.IQ4_XS: 2208}
REPACKED = tuple(GROUP_BLOCK_BYTES)
ACTIVATION = {T.Q8_0: "r8_0", T.Q4_0: "r8_0", T.IQ4_NL: "r8_0", T.Q5_0: "r8_0", T.Q4_1: "r8_1",
              T.Q5_1: "r8_1", T.Q2_K: "r8_k", T.Q3_K: "r8_k", T.Q4_K: "r8_k", T.Q5_K: "r8_k",
              T.Q6_K: "r8_k", T.IQ4_XS: "r8_k"}
ACT_BLOCK = {"r8_0": 32, "r8_1": 32, "r8_k": 256}
GGML_ACT = {"r8_0": "q8_0", "r8_1": "q8_1", "r8_k": "q8_k"}  # the ggml blocks each is quantized as
BLOCK_ELEMS = {T.Q8_0: 32, T.Q4_0: 32, T.IQ4_NL: 32, T.Q5_0: 32, T.Q4_1: 32, T.Q5_1: 32,
               T.Q2_K: 256, T.Q3_K: 256, T.Q4_K: 256, T.Q5_K: 256, T.Q6_K: 256, T.IQ4_XS: 256}


def can_repack(qtype: GGMLQuantizationType, n_rows: int, n_cols: int) -> bool:
    return qtype in GROUP_BLOCK_BYTES and n_rows % ROWS == 0 and n_cols % BLOCK_ELEMS[qtype] == 0


@dataclass(frozen=True, eq=False)
class RepackedMatrix(HostMatrix):
    """A weight matrix in the row-interleaved layout; `source` is the file's matrix."""

    data: np.ndarray  # uint8 [n_rows // 16 * n_blocks * GROUP_BLOCK_BYTES], 64-byte aligned
    source: QuantMatrix

    @property
    def qtype(self) -> GGMLQuantizationType:
        return self.source.qtype

    @property
    def n_rows(self) -> int:
        return self.source.n_rows

    @property
    def n_cols(self) -> int:
        return self.source.n_cols

    def _bytes(self) -> np.ndarray:
        return self.data


def _interleave(v: np.ndarray) -> np.ndarray:
    """u8 [rows, nb, ..., k] -> [groups, nb, ..., 16] of k-byte words: 16 rows' k-byte groups
    side by side (moved as one k-byte integer each: ~4x faster than byte by byte)."""
    word = {2: np.uint16, 4: np.uint32}[v.shape[-1]]
    v = np.ascontiguousarray(v) if v.strides[-1] != 1 else v
    return np.ascontiguousarray(_per_row(v.view(word)[..., 0])).view(np.uint8)


def _per_row(v: np.ndarray) -> np.ndarray:
    """[rows, nb, ...] -> [groups, nb, ..., 16]: a per-row field, 16 rows side by side."""
    rows, nb = v.shape[:2]
    v = v.reshape(rows // ROWS, ROWS, nb, *v.shape[2:])
    return np.moveaxis(v, 1, -1)


class _Blocks:
    """Some groups of a repacked matrix, uint8 [groups, nb, block bytes], filled part by part."""

    def __init__(self, blocks: np.ndarray) -> None:
        self.blocks = blocks
        self.at = 0

    def put(self, part: np.ndarray) -> None:
        """Append a part [groups, nb, ...] (any dtype) to every block, one strided copy."""
        if part.dtype != np.uint8:
            part = np.ascontiguousarray(part)
            part = part.view(np.uint8).reshape(*part.shape[:-1], -1)
        n = int(np.prod(part.shape[2:]))
        dest = self.blocks[:, :, self.at:self.at + n].reshape(part.shape)
        np.copyto(dest, part)
        self.at += n


def _k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> (sc, mn) u8 [..., 8] (see engine.formats.quants)."""
    lo, mid, hi = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def _q6_values(b: _FieldViews) -> np.ndarray:
    """Q6_K blocks -> u8 [rows, nb, 256]: the 6-bit values (0..63), in order."""
    ql = b["ql"].reshape(*b.shape, 2, 64)
    qh = b["qh"].reshape(*b.shape, 2, 32)
    q = np.empty((*b.shape, 2, 4, 32), np.uint8)
    a, c = ql[..., :32], ql[..., 32:]
    q[..., 0, :] = (a & 0xF) | ((qh & 3) << 4)
    q[..., 1, :] = (c & 0xF) | (((qh >> 2) & 3) << 4)
    q[..., 2, :] = (a >> 4) | (((qh >> 4) & 3) << 4)
    q[..., 3, :] = (c >> 4) | (((qh >> 6) & 3) << 4)
    return q.reshape(*b.shape, 256)


class _FieldViews:
    """b[name]: a block field as a strided view of the raw bytes ([rows, nb, ...]); faster to
    compute with than numpy's structured-field views."""

    def __init__(self, w: QuantMatrix) -> None:
        self.layout = quant_type(w.qtype).layout
        self.shape = (w.n_rows, w.raw.shape[1] // self.layout.itemsize)
        self.blocks = w.raw.reshape(*self.shape, self.layout.itemsize)

    def __getitem__(self, name: str) -> np.ndarray:
        fields = self.layout.fields
        assert fields is not None, "block layouts are structured dtypes"
        dtype, offset = fields[name][:2]
        v = self.blocks[..., offset:offset + dtype.itemsize]
        if dtype.base == np.float16:
            return np.ascontiguousarray(v).view(np.float16)[..., 0]
        return v.view(np.int8) if dtype.base == np.int8 else v


def repack(w: QuantMatrix, compiled: Callable[[QuantMatrix, np.ndarray], None] | None = None,
           alloc: Callable[[int], np.ndarray] = hugepages.anonymous) -> RepackedMatrix:
    """The repacked matrix (see the module docstring for the layouts): written by `compiled`
    (engine.kernels.gemm.repack_ir, the same bytes) where given, else by numpy, into `alloc(nbytes)`
    (a mapping of its own by default: on huge pages where the host has them, faulted in at once;
    page by page, first-touch 4 KiB faults cost more than the compiled repack itself)."""
    if not can_repack(w.qtype, w.n_rows, w.n_cols):
        raise ValueError(f"cannot repack {w.qtype.name} {w.n_rows}x{w.n_cols} "
                         f"(types {[t.name for t in REPACKED]}, rows a multiple of {ROWS})")
    nb = w.n_cols // BLOCK_ELEMS[w.qtype]
    data = alloc(w.n_rows // ROWS * nb * GROUP_BLOCK_BYTES[w.qtype])
    if compiled is not None:
        compiled(w, data)
        return RepackedMatrix(data, w)
    blocks = data.reshape(w.n_rows // ROWS, nb, GROUP_BLOCK_BYTES[w.qtype])
    for r0 in range(0, w.n_rows, CHUNK_ROWS):  # a slice at a time: temporaries stay small
        part = QuantMatrix(w.raw[r0:r0 + CHUNK_ROWS], w.qtype, min(CHUNK_ROWS, w.n_rows - r0),
                           w.n_cols)
        _repack_rows(part, _Blocks(blocks[r0 // ROWS:(r0 + part.n_rows) // ROWS]))
    return RepackedMatrix(data, w)


@dataclass(frozen=True, eq=False)
class RepackedStack(StackedMatrix):
    """A mixture's stacked experts with every matrix repacked, one after another in `data`
    (uint8 [n_mat, stack_stride]: each matrix's repacked bytes, then padding to 64 bytes):
    matrix(e) is expert e as a RepackedMatrix (a view), address + e * matrix_bytes its first
    byte, so the expert tasks take it as a StackedMatrix. `raw` stays the file's stack (the
    sources)."""

    data: np.ndarray

    @functools.cached_property
    def matrices(self) -> tuple[QuantMatrix, ...]:
        # a RepackedMatrix goes wherever a QuantMatrix does (the kernels pick its layout)
        return tuple(cast(QuantMatrix, RepackedMatrix(
            self.data[e],  # with its padding: the matrices' nbytes sum to the copy's
            QuantMatrix(self.raw[e], self.qtype, self.n_rows, self.n_cols)))
            for e in range(self.n_mat))

    @functools.cached_property
    def address(self) -> int:
        return int(self.data.ctypes.data)

    @property
    def matrix_bytes(self) -> int:
        return int(self.data[0].nbytes)


def _head(row: np.ndarray, n: int) -> np.ndarray:
    return row[:n]


def stack_stride(one_bytes: int) -> int:
    """A repacked stack's bytes per matrix: one matrix's, rounded up to 64 (aligned starts)."""
    return -(-one_bytes // 64) * 64


def repack_stack(stack: StackedMatrix,
                 repack_one: Callable[[QuantMatrix, Callable[[int], np.ndarray]], RepackedMatrix],
                 alloc: Callable[[int], np.ndarray] = hugepages.anonymous) -> RepackedStack:
    """Every expert of `stack` repacked by repack_one(matrix, alloc) into its slice of one
    allocation (alloc(n_mat * bytes of one))."""
    if not can_repack(stack.qtype, stack.n_rows, stack.n_cols):
        raise ValueError(f"cannot repack {stack.qtype.name} {stack.n_rows}x{stack.n_cols} experts")
    one = stack.n_rows // ROWS * (stack.n_cols // BLOCK_ELEMS[stack.qtype]) \
        * GROUP_BLOCK_BYTES[stack.qtype]
    stride = stack_stride(one)
    data = alloc(stack.n_mat * stride).reshape(stack.n_mat, stride)
    for e in range(stack.n_mat):
        repack_one(stack.matrix(e), functools.partial(_head, data[e]))
    return RepackedStack(stack.raw, stack.qtype, stack.n_mat, stack.n_rows, stack.n_cols, data)


CHUNK_ROWS = 1024


def _repack_rows(w: QuantMatrix, out: _Blocks) -> None:
    b = _FieldViews(w)  # [rows, nb] blocks, fields as plain byte views
    if w.qtype == T.Q8_0:
        qs = b["qs"].view(np.uint8) ^ np.uint8(0x80)                # q + 128
        out.put(_interleave(qs.reshape(*b.shape, 8, 4)))
        out.put(_per_row(b["d"]))
    elif w.qtype in (T.Q4_0, T.IQ4_NL, T.Q5_0):
        out.put(_interleave(b["qs"].reshape(*b.shape, 4, 4)))      # [.., pair k, 4]
        if w.qtype == T.Q5_0:
            out.put(_interleave(b["qh"].reshape(*b.shape, 1, 4)))
        out.put(_per_row(b["d"]))
    elif w.qtype in (T.Q4_1, T.Q5_1):
        out.put(_interleave(b["qs"].reshape(*b.shape, 4, 4)))
        if w.qtype == T.Q5_1:
            out.put(_interleave(b["qh"].reshape(*b.shape, 1, 4)))
        out.put(_per_row(b["d"]))
        out.put(_per_row(b["m"]))
    elif w.qtype in (T.Q4_K, T.Q5_K):
        sc, mn = _k_scales_mins(b["scales"])
        out.put(_per_row(b["d"]))
        out.put(_per_row(b["dmin"]))
        out.put(_per_row(sc))
        out.put(_per_row(mn))
        if w.qtype == T.Q5_K:
            out.put(_interleave(b["qh"].reshape(*b.shape, 8, 4)))  # [.., chunk, 4]
        out.put(_interleave(b["qs"].reshape(*b.shape, 4, 8, 4)))  # [.., pair, chunk, 4]
    elif w.qtype in (T.Q2_K, T.Q3_K):
        out.put(_per_row(b["d"]))
        if w.qtype == T.Q2_K:
            out.put(_per_row(b["dmin"]))
            out.put(_per_row(b["scales"] & 0xF))
            out.put(_per_row(b["scales"] >> 4))
        else:
            out.put(_per_row(q3_k_scales(b["scales"])))
            out.put(_interleave(b["hmask"].reshape(*b.shape, 8, 4)))
        out.put(_interleave(b["qs"].reshape(*b.shape, 2, 8, 4)))     # [.., half, chunk, 4]
    elif w.qtype == T.IQ4_XS:
        out.put(_per_row(b["d"]))
        out.put(_per_row(iq4_xs_scales(w.raw.view(b.layout)).astype(np.int8)))  # [.., 8, 16]
        out.put(_interleave(b["qs"].reshape(*b.shape, 8, 4, 4)))     # [.., sub-block, k, 4]
    else:  # Q6_K
        q = _q6_values(b).reshape(*b.shape, 2, 8, 2, 2, 4)  # [.., half, step, p, k, 4]
        low, high = q[..., 0, :, :, :, :], q[..., 1, :, :, :, :]  # chunks 4s+i, 32+4s+i
        ql = ((low & 0xF) | (high << 4)).reshape(*b.shape, 8, 4, 4)
        top_lo, top_hi = low >> 4, high >> 4                       # [.., 8, p, k, 4]
        qh = (top_lo[..., 0, :] | (top_lo[..., 1, :] << 2) | (top_hi[..., 0, :] << 4)
              | (top_hi[..., 1, :] << 6))                           # [.., 8 steps, 2, 4]
        out.put(_per_row(b["d"]))
        out.put(_per_row(b["scales"]))
        g, nb = b.shape[0] // ROWS, b.shape[1]
        steps = np.empty((g, nb, 8, 384), np.uint8)                # per step: ql | qh
        steps[..., :256] = _interleave(ql).reshape(g, nb, 8, 256)
        steps[..., 256:] = _interleave(qh).reshape(g, nb, 8, 128)
        out.put(steps)
    assert out.at == GROUP_BLOCK_BYTES[w.qtype]


# --- activations ------------------------------------------------------------------------------

def act_row_bytes(act: str, n_cols: int) -> int:
    nb = n_cols // ACT_BLOCK[act]
    raw = n_cols + 8 * nb if act != "r8_k" else n_cols + 4 * nb + 64 * nb + 16 * nb
    return -(-raw // 64) * 64


def act_bytes(act: str, n_cols: int, m_rows: int) -> int:
    return act_row_bytes(act, n_cols) * m_rows


def quantize_rows(x: np.ndarray, act: str) -> np.ndarray:
    """Numpy twin of the compiled quantizer: float32 [M, K] -> uint8 [M, act_row_bytes]."""
    x = np.asarray(x, np.float32)
    m_rows, k = x.shape
    nb = k // ACT_BLOCK[act]
    ggml = quantize_activations(x, GGML_ACT[act])
    out = np.zeros((m_rows, act_row_bytes(act, k)), np.uint8)
    if act == "r8_1":
        b = ggml.view(ACTIVATION_LAYOUTS["q8_1"]).reshape(m_rows, nb)
        out[:, :k] = b["qs"].reshape(m_rows, k).view(np.uint8)
        out[:, k:k + 4 * nb] = b["d"].astype(np.float32).view(np.uint8)
        out[:, k + 4 * nb:k + 8 * nb] = b["s"].astype(np.float32).view(np.uint8)
        return out
    if act == "r8_0":
        b = ggml.view(ACTIVATION_LAYOUTS["q8_0"]).reshape(m_rows, nb)
        out[:, :k] = b["qs"].reshape(m_rows, k).view(np.uint8)
        out[:, k:k + 4 * nb] = b["d"].astype(np.float32).view(np.uint8)
        c = -128 * b["qs"].astype(np.int32).sum(-1)
        out[:, k + 4 * nb:k + 8 * nb] = c.astype(np.int32).view(np.uint8)
        return out
    b = ggml.view(ACTIVATION_LAYOUTS["q8_k"]).reshape(m_rows, nb)
    out[:, :k] = b["qs"].reshape(m_rows, k).view(np.uint8)
    at = k
    out[:, at:at + 4 * nb] = b["d"].astype(np.float32).view(np.uint8)
    at += 4 * nb
    bsums = b["bsums"].astype(np.int32).reshape(m_rows, nb * 16)
    out[:, at:at + 64 * nb] = (-32 * bsums).astype(np.int32).view(np.uint8)
    at += 64 * nb
    b32 = bsums.reshape(m_rows, nb * 8, 2).sum(-1).astype(np.int16)
    out[:, at:at + 16 * nb] = b32.view(np.uint8)
    return out


# --- memory -----------------------------------------------------------------------------------

# the matrices engine.model._prepared repacks: the blocks' and the output (token_embd when tied)
MATMUL_WEIGHT = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up"
                           r"|ffn_down)\.weight|output\.weight")


def repacked_nbytes(qtype: GGMLQuantizationType, n_rows: int, n_cols: int) -> int:
    """Bytes the repacked copy of an N x K matrix takes (0 when it would not be repacked)."""
    if not can_repack(qtype, n_rows, n_cols):
        return 0
    return n_rows // ROWS * (n_cols // BLOCK_ELEMS[qtype]) * GROUP_BLOCK_BYTES[qtype]


def estimate_repacked(tensors: dict[str, tuple[GGMLQuantizationType, int, int]],
                      repacks: Callable[[GGMLQuantizationType], bool]) -> int:
    """Bytes the repacking adds to a model's footprint, from its tensor table: name ->
    (type, n_rows, n_cols); `repacks(qtype)`: whether this host's kernels repack the type.
    Each repacked copy adds its size and releases its source's pages
    (hugepages.release_file_pages), but a tied output's: token_embd stays mapped for lookups."""
    total = 0
    tied = "output.weight" not in tensors
    for n in (n for n in tensors if MATMUL_WEIGHT.fullmatch(n) or (tied and n == "token_embd.weight")):
        qtype, rows, cols = tensors[n]
        size = repacked_nbytes(qtype, rows, cols) if repacks(qtype) else 0
        if size:
            total += size - (0 if n == "token_embd.weight" else row_bytes(qtype, cols) * rows)
    return total


# the stacked experts engine.model._prepared repacks (engine.kernels.matmul's prepare_stack)
EXPERT_WEIGHT = re.compile(r"blk\.\d+\.ffn_(gate|up|down)_exps\.weight")


def estimate_repacked_stacks(tensors: dict[str, tuple[GGMLQuantizationType, int, int, int]],
                             repacks: Callable[[GGMLQuantizationType], bool]) -> int:
    """What estimate_repacked says for a mixture's stacked experts: name -> (type, n_rows,
    n_cols, n_mat); each repacked stack adds its copy and releases the file's pages."""
    total = 0
    for n in (n for n in tensors if EXPERT_WEIGHT.fullmatch(n)):
        qtype, rows, cols, n_mat = tensors[n]
        size = repacked_nbytes(qtype, rows, cols) if repacks(qtype) else 0
        if size:
            total += n_mat * (stack_stride(size) - row_bytes(qtype, cols) * rows)
    return total
