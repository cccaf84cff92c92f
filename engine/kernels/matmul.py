"""Quantized matrix multiplication: LLVM IR builders and a small runtime facade.

    out[m, r] = dot(W[r, :], x[m, :])      W: QuantMatrix [N, K]   x: float32 [M, K]   out: [M, N]

Numerics follow llama.cpp: each call quantizes the activations once (per row, to 8-bit blocks:
q8_0 for Q8_0, q8_1 for Q4_0/Q4_1/Q5_0/Q5_1, q8_k for the K-quants; engine/quants.py has the
layouts and says why Q4_0/Q5_0 differ from llama.cpp), then takes integer dot products block by
block and scales them by float block scales. F32, F16 and BF16 weights use f32 activations and
FMA. A row's arithmetic never depends on the other rows of the batch or on the thread split, so
each output row is bit-identical however the call is batched or split.

IR builders are pure (type in, IR text out). Each module holds, for one weight type:
    quantize_<act>(x, xq, nb, r0, r1, M)              rows [r0, r1) of f32 [M, K] -> packed blocks
    rows_<type>(w, xq, out, nb, r0, r1, M, N)         weight rows [r0, r1) against M rows
    matmul_<type>(w, x, xq, out, nb, M, N)            both, all rows (the one-thread path)
(float types: rows_<type>(w, x, out, K, r0, r1, M, N) and no quantizer.) The packed activations
(engine.quants.pack_activations) keep q8_0/q8_1 rows in pairs and each block's scales of 8 rows
side by side, so a tile of rows takes them with vector loads; threads quantize disjoint row
ranges into the one buffer. Callers must pass 0 <= r0 <= r1 <= N and valid buffers; the facade
MatmulKernels checks all that. Row ranges let callers split the work across threads by weight
rows. Inside rows_*, weight rows are the outer loop and activation rows the inner one, taken in
tiles (TILES): each weight block is loaded and unpacked once per tile and used for all its rows,
so the weights stream from memory once per call whatever M is. With AVX-512 the legacy types
take two rows per 512-bit vector.

Three instruction selections: the AVX2 one calls `llvm.x86.avx2.pmadd.ub.sw` (u8 x s8 -> pairwise
i16 sums) and `llvm.x86.avx2.pmadd.wd` (i16 x i16 -> pairwise i32 sums), which LLVM does not form
from plain IR; on hosts with VNNI, u8 x s8 sums of four take one `vpdpbusd` instead (the same
integers); the portable one spells the same sums in generic vector IR (same lane grouping,
so both give the same integers).
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from engine.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.kernels import jit, tasks
from engine.kernels.ops import address
from engine.kernels.irtext import IRFunction
from engine.kernels.pool import Pool
from engine.quants import (
    ACTIVATION_BLOCK,
    ACTIVATION_LAYOUTS,
    SUPPORTED,
    WEIGHT_LAYOUTS,
    QuantMatrix,
    activation_type,
    dequantize,
    dequantize_activations,
    empty_packed,
    packed_activation_bytes,
    quantize_activations,
)

T = GGMLQuantizationType
# Activation rows per tile, largest first: one unpacked weight block serves a tile's rows, whose
# accumulators live in registers. Every tile must lie in one group of 8 rows of the packed scales
# (tile sizes are powers of two, largest first, so each starts at a multiple of its size). Tiles of
# 2 make M = 2 and 3 share the unpacking too (Q4_1 1536x576, M = 2: 45 -> 35 us).
TILES = (8, 4, 2, 1)
NARROW_TILES = (4, 2, 1)  # without AVX-512's 32 vector registers, 8 rows' accumulators spill
PREFETCH_BYTES = 1024  # how far ahead in the weight row to prefetch
# Tiles of at least this many rows compute a weight row's block scales in a pass of their own
# (see _LegacyTiles); smaller ones inline them (a pass costs more than it saves for one row).
SCALE_BUFFER_ROWS = 4


# --- textual IR helpers -----------------------------------------------------------------------

def _vec(elem: str, values: Iterable[int | float | str]) -> str:
    """A constant vector: <i8 1, i8 2, ...>."""
    return "<" + ", ".join(f"{elem} {v}" for v in values) + ">"


def _splat(elem: str, n: int, value: int | float | str) -> str:
    return _vec(elem, [value] * n)


def _mask(indices: Iterable[int]) -> str:
    """A typed shufflevector mask: <n x i32> <i32 a, ...>."""
    idx = list(indices)
    return f"<{len(idx)} x i32> " + _vec("i32", idx)


def _i8(v: int) -> int:
    """An unsigned byte constant as the signed i8 literal LLVM expects."""
    return v - 256 if v > 127 else v


class _Fn(IRFunction):
    """IRFunction plus the weight-block helpers the matmul bodies share."""

    def f16_splat(self, base: str, offset: int) -> str:
        """Load a half as an <8 x float> splat.

        Spelled as a splat of the i16 so that x86 uses vpbroadcastw + vcvtph2ps: a scalar half
        load becomes vpinsrw, which merges into (and so waits for) whatever register it lands in,
        often a loop accumulator, serializing the whole loop.
        """
        h = self.let(f"insertelement <8 x i16> poison, i16 {self.load('i16', base, offset)}, i64 0")
        h = self.let(f"shufflevector <8 x i16> {h}, <8 x i16> poison, <8 x i32> zeroinitializer")
        h = self.let(f"bitcast <8 x i16> {h} to <8 x half>")
        return self.let(f"fpext <8 x half> {h} to <8 x float>")

    def f16_scalar(self, base: str, offset: int | str) -> str:
        """Load a half as a float, through a volatile 4-byte vector load (the half and the two
        bytes after it, which every weight block has): a scalar half load becomes vpinsrw,
        which merges into (and so waits for) whatever register it lands in (measured: a loop's
        accumulator, Q8_0 one row 180 -> 220 us), and LLVM narrows any plain wider load back
        to it when only the half is used."""
        v = self.let(f"load volatile <2 x half>, ptr {self.gep(base, offset)}, align 1")
        return self.let(f"extractelement <2 x float> {self.let(f'fpext <2 x half> {v} to <2 x float>')}, i64 0")

    def f32_splat(self, base: str, offset: int) -> str:
        return self.splat_float(self.load("float", base, offset))

    def hsum8(self, v: str) -> str:
        return self.let(f"call reassoc float @llvm.vector.reduce.fadd.v8f32(float -0.0, <8 x float> {v})")

    def nibbles32(self, base: str, offset: int) -> str:
        """16 bytes -> <32 x i8>: low nibbles then high nibbles (values 0..15)."""
        qs = self.load("<16 x i8>", base, offset)
        # [qs | qs] with the upper copy shifted right by 4 as 64-bit lanes (vbroadcasti128 +
        # vpsrlvq), then one mask: cheaper than shifting a copy and inserting it
        both = self.let(f"shufflevector <16 x i8> {qs}, <16 x i8> poison, {_mask(list(range(16)) * 2)}")
        wide = self.let(f"bitcast <32 x i8> {both} to <4 x i64>")
        wide = self.let(f"lshr <4 x i64> {wide}, <i64 0, i64 0, i64 4, i64 4>")
        both = self.let(f"bitcast <4 x i64> {wide} to <32 x i8>")
        return self.let(f"and <32 x i8> {both}, {_splat('i8', 32, 15)}")

    def bits32(self, word: str, value: int) -> str:
        """i32 -> <32 x i8>: `value` where bit j is set, else 0."""
        bits = self.let(f"bitcast i32 {word} to <32 x i1>")
        return self.let(f"select <32 x i1> {bits}, <32 x i8> {_splat('i8', 32, value)}, "
                        f"<32 x i8> zeroinitializer")


DECLARATIONS = """
declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)
declare <4 x float> @llvm.fma.v4f32(<4 x float>, <4 x float>, <4 x float>)
declare <2 x float> @llvm.fma.v2f32(<2 x float>, <2 x float>, <2 x float>)
declare <1 x float> @llvm.fma.v1f32(<1 x float>, <1 x float>, <1 x float>)
declare float @llvm.fma.f32(float, float, float)
declare float @llvm.vector.reduce.fadd.v8f32(float, <8 x float>)
declare float @llvm.vector.reduce.fmax.v32f32(<32 x float>)
declare float @llvm.maxnum.f32(float, float)
declare <32 x float> @llvm.fabs.v32f32(<32 x float>)
declare float @llvm.fabs.f32(float)
declare <32 x float> @llvm.roundeven.v32f32(<32 x float>)
declare i32 @llvm.vector.reduce.add.v32i32(<32 x i32>)
declare i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)
declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)
declare <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)
declare <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>, <8 x i32>, <8 x i32>)
declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)
declare <64 x i8> @llvm.abs.v64i8(<64 x i8>, i1)
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
"""


class _IntOps:
    """The integer dot-product primitives, in AVX2 intrinsics or in portable IR.

    maddubs(u, s): <32 x i8> unsigned x <32 x i8> signed -> <16 x i16>, lane k = u[2k]s[2k] + u[2k+1]s[2k+1]
    madd(a, b):    <16 x i16> x <16 x i16> -> <8 x i32>,  lane k = a[2k]b[2k] + a[2k+1]b[2k+1]
    Callers keep every sum small enough that the AVX2 form never saturates, so both agree.
    """

    def __init__(self, f: _Fn, avx2: bool, vnni: bool = False) -> None:
        self.f = f
        self.avx2 = avx2
        self.vnni = vnni and avx2

    def _pairs(self, v: str, n: int, elem: str) -> str:
        """<2n x elem> -> <n x elem>: sum of adjacent pairs."""
        f = self.f
        ev = f.let(f"shufflevector <{2 * n} x {elem}> {v}, <{2 * n} x {elem}> poison, {_mask(range(0, 2 * n, 2))}")
        od = f.let(f"shufflevector <{2 * n} x {elem}> {v}, <{2 * n} x {elem}> poison, {_mask(range(1, 2 * n, 2))}")
        return f.let(f"add <{n} x {elem}> {ev}, {od}")

    def maddubs(self, u: str, s: str) -> str:
        f = self.f
        if self.avx2:
            return f.let(f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {u}, <32 x i8> {s})")
        uw = f.let(f"zext <32 x i8> {u} to <32 x i16>")
        sw = f.let(f"sext <32 x i8> {s} to <32 x i16>")
        return self._pairs(f.let(f"mul <32 x i16> {uw}, {sw}"), 16, "i16")

    def madd(self, a: str, b: str) -> str:
        f = self.f
        if self.avx2:
            return f.let(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {a}, <16 x i16> {b})")
        aw = f.let(f"sext <16 x i16> {a} to <16 x i32>")
        bw = f.let(f"sext <16 x i16> {b} to <16 x i32>")
        return self._pairs(f.let(f"mul <16 x i32> {aw}, {bw}"), 8, "i32")

    def dot_us(self, u: str, s: str) -> str:
        """<8 x i32>, lane k = sum of u[j]*s[j] for j in 4k..4k+3 (u unsigned).

        With VNNI one vpdpbusd does it (the same exact integer sums as maddubs + madd, which
        never saturate here).
        """
        if self.vnni:
            return self._vpdpbusd(u, s, 8)
        return self.madd(self.maddubs(u, s), _splat("i16", 16, 1))

    def dot_us_wide(self, u: str, s: str) -> str:
        """dot_us on <64 x i8> (two rows' blocks side by side) -> <16 x i32> (AVX-512 VNNI)."""
        return self._vpdpbusd(u, s, 16)

    def _vpdpbusd(self, u: str, s: str, lanes: int) -> str:
        """<4 * lanes x i8> u (unsigned) and s (signed) -> <lanes x i32>: sums of four products."""
        f, ty = self.f, f"<{lanes} x i32>"
        u32 = f.let(f"bitcast <{4 * lanes} x i8> {u} to {ty}")
        s32 = f.let(f"bitcast <{4 * lanes} x i8> {s} to {ty}")
        return f.let(f"call {ty} @llvm.x86.avx512.vpdpbusd.{32 * lanes}({ty} zeroinitializer, "
                     f"{ty} {u32}, {ty} {s32})")

    def signed_wide(self, a: str) -> tuple[str, str]:
        """Signed weights `a` (<32 x i8>) for dot_ss_wide: (|a| twice, a < 0 twice)."""
        f = self.f
        a2 = f.let(f"shufflevector <32 x i8> {a}, <32 x i8> poison, {_mask(list(range(32)) * 2)}")
        mag = f.let(f"call <64 x i8> @llvm.abs.v64i8(<64 x i8> {a2}, i1 false)")
        return mag, f.let(f"icmp slt <64 x i8> {a2}, zeroinitializer")

    def dot_ss_wide(self, prepared: tuple[str, str], s: str) -> str:
        """dot_ss on <64 x i8>: |a| times (s negated where a < 0); AVX-512 has no vpsignb."""
        f = self.f
        mag, negative = prepared
        flipped = f.let(f"sub <64 x i8> zeroinitializer, {s}")
        return self.dot_us_wide(mag, f.let(f"select <64 x i1> {negative}, <64 x i8> {flipped}, <64 x i8> {s}"))

    def signed(self, a: str) -> tuple[str, str]:
        """Prepare signed weights `a` (loop-invariant over activation rows) for dot_ss."""
        if self.avx2:  # u8 |a| times sign(a)*s: maddubs then sees an unsigned operand
            return self.f.let(f"call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> {a}, <32 x i8> {a})"), a
        return a, a

    def dot_ss(self, prepared: tuple[str, str], s: str) -> str:
        """<8 x i32>, lane k = sum of a[j]*s[j] for j in 4k..4k+3 (both signed)."""
        f = self.f
        mag, a = prepared
        if self.avx2:
            signed_s = f.let(f"call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> {s}, <32 x i8> {a})")
            return self.dot_us(mag, signed_s)
        aw = f.let(f"sext <32 x i8> {a} to <32 x i32>")
        sw = f.let(f"sext <32 x i8> {s} to <32 x i32>")
        return self._pairs(self._pairs(f.let(f"mul <32 x i32> {aw}, {sw}"), 16, "i32"), 8, "i32")


# --- per-type block bodies --------------------------------------------------------------------
# A body handles one weight block against the same block of several activation rows: it unpacks
# the weights once and returns, per row, the block's contribution as terms
#     _Vec(value, scale): float(value) * scale, value <8 x i32>, scale a splat
# which _fold adds into that row's <8 x float> accumulator.

@dataclass(frozen=True)
class _Vec:
    value: str  # <8 x i32>
    scale: str  # <8 x float>, a splat


_Terms = list[_Vec]
_Body = Callable[[_Fn, _IntOps, str, list[str]], list[_Terms]]

V8F = "<8 x float>"


# Legacy types accumulate in llama.cpp's order (ggml_vec_dot_q4_1_q8_1 and friends on x86):
# per block one FMA into a single <8 x float> accumulator, the block-offset products summed
# into a scalar, then hsum(acc) + offsets. So our dot products are llama.cpp's, bit for bit for
# Q4_1/Q5_1/Q8_0 (Q4_0/Q5_0 take q8_1 activations here, see engine/quants.py).
LEGACY = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
_OFFSET = {T.Q4_0: -8.0, T.Q5_0: -16.0}  # these types' offsets are -8d or -16d


@dataclass(frozen=True)
class _Tile:
    """Activation rows m0 .. m0 + rows - 1, taken together against one weight row."""
    m0: str  # i64 SSA value
    rows: int


# A weight type's loop body, as three callbacks of _emit_rows:
#   accs(rows)                        the (type, initial value) of a tile's loop-carried values
#   block(w blocks, block indices, tile, values) -> values     one group of weight blocks
#   finish(weight row, tile, values) -> one float per tile row
_Accs = Callable[[int], list[tuple[str, str]]]
_Block = Callable[[list[str], list[str], _Tile, list[str]], list[str]]
_Finish = Callable[[str, _Tile, list[str]], list[str]]


def _fma_vec(f: _Fn, n: int, a: str, b: str, c: str) -> str:
    ty = f"<{n} x float>"
    return f.let(f"call {ty} @llvm.fma.v{n}f32({ty} {a}, {ty} {b}, {ty} {c})")


class _Packed:
    """Byte addresses in packed q8_0 / q8_1 activations (engine.quants.pack_activations):

        qs      [ceil(M / 2), nb, 2, 32] i8     rows in pairs
        scales  [ceil(M / 8), nb, k, 8] f32     k = 1 (d) for q8_0, 2 (d, s) for q8_1

    Strides along the blocks are constants (64 and 32 * k bytes), so a loop over blocks walks
    all of them with one index.
    """

    def __init__(self, f: _Fn, act: str) -> None:
        self.f = f
        self.k = 2 if act == "q8_1" else 1
        pairs = f.let(f"lshr i64 {f.add('%M', 1)}, 1")
        self.scales = f.gep("%xq", f.mul(f.mul(pairs, "%nb"), 64))

    def qs(self, row: str, b: str) -> str:
        """Address of row's block b (a 64-byte load from an even row takes the pair's)."""
        f = self.f
        pair = f.let(f"lshr i64 {row}, 1")
        odd = f.mul(f.let(f"and i64 {row}, 1"), 32)
        return f.gep("%xq", f.add(f.mul(f.add(f.mul(pair, "%nb"), b), 64), odd))

    def scale(self, row: str, b: str, which: int) -> str:
        """Address of d (which = 0) or s (which = 1) of row's block b; the next rows of row's
        group of 8 follow it."""
        f = self.f
        group = f.let(f"lshr i64 {row}, 3")
        lane = f.mul(f.let(f"and i64 {row}, 7"), 4)
        at = f.add(f.mul(f.add(f.mul(group, "%nb"), b), 32 * self.k), lane)
        return f.gep(self.scales, at if which == 0 else f.add(at, 32))


class _LegacyTiles:
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 against packed q8_0 / q8_1 activations: the callbacks of
    _emit_rows.

    Weight block: f16 d [| f16 m] [| u32 qh] | qs. Activations (_Packed): y, a row's block of 32
    i8 values, rows in pairs; its scale dx and, for q8_1, s = dx * sum(y), 8 rows side by side.
    q = nibbles (values 0..15 from the low then the high nibbles of qs), | bit j of qh << 4 (Q5),
    or the i8 qs (Q8_0). isum = sum(q * y) per 4-lane group (dot_us); all but Q8_0 take q
    unsigned (maddubs needs one unsigned operand) and add the offset through s; Q8_0 is signed
    (dot_ss: |q| times sign(q) * y). For a tile of rows m0 + t against weight row r:

        prologue, per block b:  scale[b, t] = d[b] * dx[b, m0 + t]      (one vector multiply)
        per block b:            Q4_1/Q5_1:  offs = fma(m, s[b, m0 + t], offs)   (a vector too)
                                Q4_0/Q5_0:  offs = fma(-8d or -16d, s[b, m0 + t], offs)
                                per row t:  acc[t] = fma(splat(scale[b, t]), float(isum[t]), acc[t])
        finish, per row t:      hsum(acc[t]) + offs[t]

    Each lane does what llama.cpp does for its row, in the same order. With AVX-512 (`wide`) a
    pair of rows shares one <16 x ...> vector: lanes 0-7 are the even row's, 8-15 the odd row's
    (one 64-byte activation load, one permute for both rows' scales; lane for lane the same
    arithmetic). Scales go through a stack buffer written before the block loop, so a row's
    splat is a broadcast load or a pair's one permute, not a multiply and two shuffles.
    (Q4_1 1536x576, 8 rows, one thread, best of 7 x 160 calls: 129 us with per-row scales,
    95 narrow, 75 wide.)
    """

    def __init__(self, qtype: GGMLQuantizationType, f: _Fn, ops: _IntOps, max_rows: int,
                 w_block_bytes: int, wide: bool) -> None:
        self.qtype, self.f, self.ops = qtype, f, ops
        self.w_block_bytes = w_block_bytes
        self.wide = wide
        self.offsets = qtype != T.Q8_0
        self.qs_at = {T.Q4_0: 2, T.Q4_1: 4, T.Q5_0: 6, T.Q5_1: 8, T.Q8_0: 2}[qtype]
        self.qh_at = {T.Q5_0: 2, T.Q5_1: 4}.get(qtype)
        self.packed = _Packed(f, "q8_0" if qtype == T.Q8_0 else "q8_1")
        self.scales = f.let(f"alloca float, i64 {f.mul('%nb', max_rows)}, align 32")  # [nb, rows]

    def _pairs(self, rows: int) -> int:
        return rows // 2 if self.wide else 0

    def accs(self, rows: int) -> list[tuple[str, str]]:
        pairs = self._pairs(rows)
        values = [("<16 x float>", "zeroinitializer")] * pairs + [(V8F, "zeroinitializer")] * (rows - 2 * pairs)
        return values + [(f"<{rows} x float>", "zeroinitializer")] if self.offsets else values

    def prologue(self, w_row: str, tile: _Tile) -> None:
        f, n = self.f, tile.rows
        vn = f"<{n} x float>"
        if n < SCALE_BUFFER_ROWS:
            return

        def per_block(b: str, _: list[str]) -> list[str]:
            d = f.f16_scalar(w_row, f.mul(b, self.w_block_bytes))
            dx = f.load(vn, self.packed.scale(tile.m0, b, 0), 0, 4)
            f.store(vn, f.let(f"fmul {vn} {f.splat_float(d, n)}, {dx}"), self.scales, f.mul(b, 4 * n), 4)
            return []

        f.loop("%nb", [], per_block)

    def block(self, wbs: list[str], idx: list[str], tile: _Tile, values: list[str]) -> list[str]:
        f, ops, qtype = self.f, self.ops, self.qtype
        out = list(values)
        n = tile.rows
        pairs = self._pairs(n)
        vn = f"<{n} x float>"
        for w, b in zip(wbs, idx):
            if qtype == T.Q8_0:
                raw = f.load("<32 x i8>", w, self.qs_at)
                prepared = ops.signed(raw)
                wide = ops.signed_wide(raw) if pairs else None
            else:
                q = f.nibbles32(w, self.qs_at)
                if self.qh_at is not None:
                    q = f.let(f"or <32 x i8> {q}, {f.bits32(f.load('i32', w, self.qh_at), 16)}")
                if pairs:  # the block for both rows of a pair
                    q2 = f.let(f"shufflevector <32 x i8> {q}, <32 x i8> poison, {_mask(list(range(32)) * 2)}")
                if qtype in (T.Q4_1, T.Q5_1):  # f16 d | f16 m, converted together
                    dm = f.let(f"fpext <2 x half> {f.load('<2 x half>', w, 0)} to <2 x float>")
                    d = f.let(f"extractelement <2 x float> {dm}, i64 0")
                    m = f.let(f"extractelement <2 x float> {dm}, i64 1")
                else:  # -8d or -16d: exact, a power of two
                    d = f.f16_scalar(w, 0)
                    m = f.let(f"fmul float {d}, {_OFFSET[qtype]:.1f}")
                s = f.load(vn, self.packed.scale(tile.m0, b, 1), 0, 4)
                out[n - pairs] = _fma_vec(f, n, f.splat_float(m, n), s, out[n - pairs])
            scale_row = f.gep(self.scales, f.mul(b, 4 * n))
            if n < SCALE_BUFFER_ROWS:  # few rows: the scales in a register, splat by shuffles
                if qtype == T.Q8_0:
                    d = f.f16_scalar(w, 0)
                dx = f.load(vn, self.packed.scale(tile.m0, b, 0), 0, 4)
                scales = f.let(f"fmul {vn} {f.splat_float(d, n)}, {dx}")
            else:
                scales = f.load(vn, scale_row, 0, 4)

            def splat(lanes: list[int]) -> str:
                if n < SCALE_BUFFER_ROWS or len(lanes) > 8:
                    return f.let(f"shufflevector {vn} {scales}, {vn} poison, {_mask(lanes)}")
                return f.splat_float(f.load("float", scale_row, 4 * lanes[0], 4))  # a broadcast load

            for p in range(pairs):
                y = f.load("<64 x i8>", self.packed.qs(f.add(tile.m0, 2 * p), b))
                isum = ops.dot_ss_wide(wide, y) if qtype == T.Q8_0 else ops.dot_us_wide(q2, y)
                fs = f.let(f"sitofp <16 x i32> {isum} to <16 x float>")
                out[p] = _fma_vec(f, 16, splat([2 * p] * 8 + [2 * p + 1] * 8), fs, out[p])
            for t in range(2 * pairs, n):
                y = f.load("<32 x i8>", self.packed.qs(f.add(tile.m0, t), b))
                isum = ops.dot_ss(prepared, y) if qtype == T.Q8_0 else ops.dot_us(q, y)
                fs = f.let(f"sitofp <8 x i32> {isum} to <8 x float>")
                out[t - pairs] = _fma_vec(f, 8, splat([t] * 8), fs, out[t - pairs])
        return out

    def finish(self, _w: str, tile: _Tile, values: list[str]) -> list[str]:
        f, n = self.f, tile.rows
        pairs = self._pairs(n)
        row_accs = []
        for p in range(pairs):
            for h in range(2):
                row_accs.append(f.let(f"shufflevector <16 x float> {values[p]}, <16 x float> poison, "
                                      f"{_mask(range(8 * h, 8 * h + 8))}"))
        row_accs += values[pairs:pairs + n - 2 * pairs]
        results = []
        for t in range(n):
            total = _hsum_halves(f, row_accs[t])
            if self.offsets:
                off = f.let(f"extractelement <{n} x float> {values[n - pairs]}, i64 {t}")
                total = f.let(f"fadd float {total}, {off}")
            results.append(total)
        return results


def _row_tiles(f: _Fn, *, x_base: str, x_row_bytes: str, x_block_bytes: int,
               acc_types: tuple[str, ...],
               block: Callable[[list[str], list[list[str]], list[list[str]]], list[list[str]]],
               finish: Callable[[list[str], str, str], str]) -> tuple[_Accs, _Block, _Finish]:
    """Callbacks for activations stored row by row (q8_k blocks, or f32 values): each tile row
    keeps its own accumulators (acc_types); block(w blocks, x blocks per row, accs per row) and
    finish(row's accs, weight row, x row) work row by row."""
    k = len(acc_types)

    def accs(rows: int) -> list[tuple[str, str]]:
        return [(ty, "zeroinitializer") for _ in range(rows) for ty in acc_types]

    def x_rows(tile: _Tile) -> list[str]:
        return [f.gep(x_base, f.mul(f.add(tile.m0, t), x_row_bytes)) for t in range(tile.rows)]

    def tile_block(wbs: list[str], idx: list[str], tile: _Tile, values: list[str]) -> list[str]:
        xss = [[f.gep(x, f.mul(b, x_block_bytes)) for b in idx] for x in x_rows(tile)]
        per_row = [values[t * k:(t + 1) * k] for t in range(tile.rows)]
        return [v for row in block(wbs, xss, per_row) for v in row]

    def tile_finish(w_row: str, tile: _Tile, values: list[str]) -> list[str]:
        return [finish(values[t * k:(t + 1) * k], w_row, x) for t, x in enumerate(x_rows(tile))]

    return accs, tile_block, tile_finish


def _hsum_halves(f: _Fn, v: str) -> str:
    """Sum of 8 lanes as llama.cpp's hsum_float_8 adds them: (hi + lo), then halves again."""
    lo = f.let(f"shufflevector <8 x float> {v}, <8 x float> poison, {_mask(range(4))}")
    hi = f.let(f"shufflevector <8 x float> {v}, <8 x float> poison, {_mask(range(4, 8))}")
    r = f.let(f"fadd <4 x float> {hi}, {lo}")
    r = f.let(f"fadd <4 x float> {r}, {f.let(f'shufflevector <4 x float> {r}, <4 x float> poison, {_mask([2, 3, 2, 3])}')}")
    a = f.let(f"extractelement <4 x float> {r}, i64 0")
    return f.let(f"fadd float {a}, {f.let(f'extractelement <4 x float> {r}, i64 1')}")


def _k_scales_mins(f: _Fn, w: str) -> tuple[str, str]:
    """Q4_K/Q5_K: the 12 packed scale bytes at w+4 -> (<8 x i16> sc, <8 x i16> mn).

    As 32-bit words W0, W1, W2 (bytes 0-3, 4-7, 8-11): sc[0..3] = W0 & 0x3f per byte,
    mn[0..3] = W1 & 0x3f, sc[4..7] = (W2 & 0xf) | (W0 >> 6) << 4, mn[4..7] = (W2 >> 4) | (W1 >> 6) << 4.
    """
    w0, w1, w2 = (f.load("i32", w, 4 + 4 * k) for k in range(3))

    def low6(word: str) -> str:
        return f.let(f"and i32 {word}, {0x3F3F3F3F}")

    def top2(word: str) -> str:  # top 2 bits of each byte, moved to bits 4..5
        s = f.let(f"lshr i32 {word}, 6")
        s = f.let(f"and i32 {s}, {0x03030303}")
        return f.let(f"shl i32 {s}, 4")

    sc_hi = f.let(f"or i32 {f.let(f'and i32 {w2}, {0x0F0F0F0F}')}, {top2(w0)}")
    w2_high = f.let(f"lshr i32 {w2}, 4")
    mn_hi = f.let(f"or i32 {f.let(f'and i32 {w2_high}, {0x0F0F0F0F}')}, {top2(w1)}")

    def bytes8(lo: str, hi: str) -> str:
        v = f.let(f"insertelement <2 x i32> poison, i32 {lo}, i64 0")
        v = f.let(f"insertelement <2 x i32> {v}, i32 {hi}, i64 1")
        return f.let(f"zext <8 x i8> {f.let(f'bitcast <2 x i32> {v} to <8 x i8>')} to <8 x i16>")

    return bytes8(low6(w0), sc_hi), bytes8(low6(w1), mn_hi)


def _k4_5_body(qtype: GGMLQuantizationType) -> _Body:
    """Q4_K / Q5_K against q8_k (f32 dx | i8 y[256] | i16 bsums[16]).

    Per chunk c of 32 qs bytes: low nibbles are sub-block 2c, high nibbles 2c+1 (Q5_K: plus 16
    where bit 2c / 2c+1 of qh[l] is set). isum += madd(maddubs(q, y), splat(sc[j])) keeps the
    scaled integer sums in i32 lanes; the mins need only the activation block sums:
    sum_j mn[j] * (bsums[2j] + bsums[2j+1]) = madd(bsums, mn with each repeated twice).
    Terms: d*dx * isum and -dmin*dx * minsum.
    """
    qs_at = 16 if qtype == T.Q4_K else 48

    def block(f: _Fn, ops: _IntOps, w: str, xs: list[str]) -> list[_Terms]:
        d, dmin = f.f16_splat(w, 0), f.f16_splat(w, 2)
        sc, mn = _k_scales_mins(f, w)
        mn16 = f.let(f"shufflevector <8 x i16> {mn}, <8 x i16> poison, {_mask(j // 2 for j in range(16))}")
        qh = f.load("<32 x i8>", w, 16) if qtype == T.Q5_K else None
        isums = ["zeroinitializer"] * len(xs)
        for c in range(4):
            qs = f.load("<32 x i8>", w, qs_at + 32 * c)
            halves = [f.let(f"and <32 x i8> {qs}, {_splat('i8', 32, 15)}"),
                      f.let(f"lshr <32 x i8> {qs}, {_splat('i8', 32, 4)}")]
            for h in range(2):
                j = 2 * c + h
                q = halves[h]
                if qh is not None:
                    bit = f.let(f"and <32 x i8> {qh}, {_splat('i8', 32, _i8(1 << j))}")
                    is_set = f.let(f"icmp ne <32 x i8> {bit}, zeroinitializer")
                    high = f.let(f"select <32 x i1> {is_set}, <32 x i8> {_splat('i8', 32, 16)}, "
                                 f"<32 x i8> zeroinitializer")
                    q = f.let(f"or <32 x i8> {q}, {high}")
                scale = f.let(f"shufflevector <8 x i16> {sc}, <8 x i16> poison, {_mask([j] * 16)}")
                for t, x in enumerate(xs):
                    y = f.load("<32 x i8>", x, 4 + 32 * j)
                    part = ops.madd(ops.maddubs(q, y), scale)
                    isums[t] = f.let(f"add <8 x i32> {isums[t]}, {part}")
        out: list[_Terms] = []
        for t, x in enumerate(xs):
            dx = f.f32_splat(x, 0)
            minsum = ops.madd(f.load("<16 x i16>", x, 260), mn16)
            neg_dmin_dx = f.let(f"fneg <8 x float> {f.let(f'fmul <8 x float> {dmin}, {dx}')}")
            out.append([_Vec(isums[t], f.let(f"fmul <8 x float> {d}, {dx}")), _Vec(minsum, neg_dmin_dx)])
        return out

    return block


def _q6_k_body() -> _Body:
    """Q6_K against q8_k.

    Per half h and l < 32 the four 6-bit vectors are built from ql[64h + l], ql[64h + 32 + l] and
    the 2-bit fields of qh[32h + l] (see engine/quants.py); vector v covers values 128h + 32v +
    (0..31), whose scales are scales[8h + 2v] (first 16) and scales[8h + 2v + 1] (next 16): the
    i16 lanes of maddubs split the same way, so madd with [s_a x8, s_b x8] applies them.
    q is unsigned (0..63); the -32 offset comes off once: corr = 32 * madd(bsums, scales).
    Term: d*dx * (isum - corr).
    """

    def block(f: _Fn, ops: _IntOps, w: str, xs: list[str]) -> list[_Terms]:
        d = f.f16_splat(w, 208)
        sc16 = f.let(f"sext <16 x i8> {f.load('<16 x i8>', w, 192)} to <16 x i16>")
        isums = ["zeroinitializer"] * len(xs)
        low4, hi2 = _splat("i8", 32, 15), _splat("i8", 32, 0x30)
        for h in range(2):
            qa = f.load("<32 x i8>", w, 64 * h)
            qb = f.load("<32 x i8>", w, 64 * h + 32)
            qh = f.load("<32 x i8>", w, 128 + 32 * h)
            # the 2-bit fields qh >> 0, 2, 4, 6, each moved to bits 4..5
            moved = [f.let(f"shl <32 x i8> {qh}, {_splat('i8', 32, 4)}"),
                     f.let(f"shl <32 x i8> {qh}, {_splat('i8', 32, 2)}"),
                     qh,
                     f.let(f"lshr <32 x i8> {qh}, {_splat('i8', 32, 2)}")]
            qh_bits = [f.let(f"and <32 x i8> {v}, {hi2}") for v in moved]
            nib = [f.let(f"and <32 x i8> {qa}, {low4}"), f.let(f"and <32 x i8> {qb}, {low4}"),
                   f.let(f"lshr <32 x i8> {qa}, {_splat('i8', 32, 4)}"),
                   f.let(f"lshr <32 x i8> {qb}, {_splat('i8', 32, 4)}")]
            for v in range(4):
                q = f.let(f"or <32 x i8> {nib[v]}, {qh_bits[v]}")
                g = 8 * h + 2 * v
                scale = f.let(f"shufflevector <16 x i16> {sc16}, <16 x i16> poison, {_mask([g] * 8 + [g + 1] * 8)}")
                for t, x in enumerate(xs):
                    y = f.load("<32 x i8>", x, 4 + 128 * h + 32 * v)
                    part = ops.madd(ops.maddubs(q, y), scale)
                    isums[t] = f.let(f"add <8 x i32> {isums[t]}, {part}")
        out: list[_Terms] = []
        for t, x in enumerate(xs):
            dx = f.f32_splat(x, 0)
            corr = ops.madd(f.load("<16 x i16>", x, 260), sc16)
            corr = f.let(f"shl <8 x i32> {corr}, {_splat('i32', 8, 5)}")
            isum = f.let(f"sub <8 x i32> {isums[t]}, {corr}")
            out.append([_Vec(isum, f.let(f"fmul <8 x float> {d}, {dx}"))])
        return out

    return block


def _quant_body(qtype: GGMLQuantizationType) -> _Body:
    """The K-quant block bodies (legacy types go through _LegacyTiles)."""
    if qtype in (T.Q4_K, T.Q5_K):
        return _k4_5_body(qtype)
    if qtype == T.Q6_K:
        return _q6_k_body()
    raise ValueError(f"no integer kernel for {qtype.name}")


def _fold(f: _Fn, terms: _Terms, acc: str) -> str:
    """Add a group of terms to one row's <8 x float> accumulator.

    The group's sum is formed first (fmul, then FMAs) and added to the accumulator once, so the
    loop-carried chain is one fadd per group rather than one FMA per term.
    """
    part = None
    for t in terms:
        fs = f.let(f"sitofp <8 x i32> {t.value} to <8 x float>")
        part = (f.let(f"fmul <8 x float> {fs}, {t.scale}") if part is None else
                f.let(f"call <8 x float> @llvm.fma.v8f32(<8 x float> {fs}, <8 x float> {t.scale}, <8 x float> {part})"))
    return f.let(f"fadd <8 x float> {acc}, {part}")


# --- activation quantizer ---------------------------------------------------------------------

def _emit_quantize_chunk(f: _Fn, src: str, dst: str, inv: str) -> str:
    """Quantize 32 floats at src with scale `inv` into 32 i8 at dst; returns their <32 x i32>."""
    v = f.load("<32 x float>", src)
    s = f.let(f"fmul <32 x float> {v}, {f.splat_float(inv, 32)}")
    r = f.let(f"call <32 x float> @llvm.roundeven.v32f32(<32 x float> {s})")
    q = f.let(f"fptosi <32 x float> {r} to <32 x i32>")
    f.store("<32 x i8>", f.let(f"trunc <32 x i32> {q} to <32 x i8>"), dst)
    return q


def _emit_absmax(f: _Fn, src: str, n_chunks: int) -> str:
    amax = None
    for c in range(n_chunks):
        v = f.load("<32 x float>", src, 128 * c)
        a = f.let(f"call <32 x float> @llvm.fabs.v32f32(<32 x float> {v})")
        m = f.let(f"call float @llvm.vector.reduce.fmax.v32f32(<32 x float> {a})")
        amax = m if amax is None else f.let(f"call float @llvm.maxnum.f32(float {amax}, float {m})")
    assert amax is not None
    return amax


def _round_to_half(f: _Fn, x: str) -> str:
    """x rounded to the nearest f16 value, kept as f32 (ggml stores q8_1's d and s as f16).

    Beyond f16's range ggml's value would be inf; the f32 slot keeps x itself instead, so a
    huge activation block stays finite (and equal to llama.cpp wherever llama.cpp is finite).
    """
    r = f.let(f"fpext half {f.let(f'fptrunc float {x} to half')} to float")
    big = f.let(f"fcmp ogt float {f.let(f'call float @llvm.fabs.f32(float {x})')}, 65504.0")
    return f.let(f"select i1 {big}, float {x}, float {r}")


def build_quantize_ir(act: str) -> str:
    """quantize_<act>(ptr x, ptr xq, i64 nb, i64 r0, i64 r1, i64 M): rows [r0, r1) of x, f32
    [M, nb * block], into the packed activations of all M rows (engine.quants.pack_activations:
    q8_0/q8_1 keep a block's i8 values of rows in pairs and its scales of 8 rows side by side,
    see _Packed; q8_k keeps ggml's blocks row by row), so threads can quantize disjoint row ranges.

    Per block, as ggml quantizes: d = max|x| / 127, q = roundeven(x * (127 / max|x|)) (0 when
    max|x| == 0); no fast-math, so the numpy twin (engine.quants.quantize_activations, then
    pack_activations) gives the same bytes. q8_0 and q8_1 carry d (and q8_1's s = d * sum(q))
    rounded to f16 like ggml's blocks (q8_0 as f16 itself, overflowing like ggml, q8_1 keeping a
    value beyond f16's range), stored in f32 slots so the kernel needs no conversion.
    """
    elems = ACTIVATION_BLOCK[act]
    f = _Fn(f"void @quantize_{act}(ptr noalias %x, ptr noalias %xq, i64 %nb, i64 %r0, i64 %r1, i64 %M)")
    packed = _Packed(f, act) if act != "q8_k" else None

    def per_block(m: str, j: str) -> None:  # block j of row m
        b = f.add(f.mul(m, "%nb"), j)
        src = f.gep("%x", f.mul(b, 4 * elems))
        amax = _emit_absmax(f, src, elems // 32)
        d = f.let(f"fdiv float {amax}, 127.0")
        nonzero = f.let(f"fcmp one float {amax}, 0.0")
        inv = f.let(f"select i1 {nonzero}, float {f.let(f'fdiv float 127.0, {amax}')}, float 0.0")
        if act == "q8_k":
            dst = f.gep("%xq", f.mul(b, ACTIVATION_LAYOUTS[act].itemsize))
            f.store("float", d, dst, 0)
            for c in range(elems // 32):
                q = _emit_quantize_chunk(f, f.gep(src, 128 * c), f.gep(dst, 4 + 32 * c), inv)
                for half in range(2):
                    part = f.let(f"shufflevector <32 x i32> {q}, <32 x i32> poison, "
                                 f"{_mask(range(16 * half, 16 * half + 16))}")
                    s = f.let(f"call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> {part})")
                    f.store("i16", f.let(f"trunc i32 {s} to i16"), dst, 260 + 2 * (2 * c + half))
            return
        assert packed is not None
        q = _emit_quantize_chunk(f, src, packed.qs(m, j), inv)
        if act == "q8_1":
            f.store("float", _round_to_half(f, d), packed.scale(m, j, 0), 0, 4)
            qsum = f.let(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {q})")
            s = f.let(f"fmul float {d}, {f.let(f'sitofp i32 {qsum} to float')}")
            f.store("float", _round_to_half(f, s), packed.scale(m, j, 1), 0, 4)
        else:
            dh = f.let(f"fptrunc float {d} to half")
            f.store("float", f.let(f"fpext half {dh} to float"), packed.scale(m, j, 0), 0, 4)

    f.loop_range("%r0", "%r1", lambda m: f.loop("%nb", [], lambda j, _: per_block(m, j) or []))
    f.do("ret void")
    return f.text()


# --- rows kernels -----------------------------------------------------------------------------

def _emit_rows(f: _Fn, *, n_blocks: str, w_block_bytes: int, w_row_bytes: str, group: int,
               accs: _Accs, block: _Block, finish: _Finish, prefetch: bool,
               tiles: tuple[int, ...], prologue: Callable[[str, _Tile], None] | None = None) -> None:
    """The shared loop nest, writing out[m * N + r]:

        for r in [r0, r1):                          weight rows (the split across threads)
            for each tile of tiles[0] activation rows, then of tiles[1] in what is left, ...:
                prologue(w row, tile)                 (if given)
                for each group of `group` blocks, then each leftover block:
                    values = block(w[r, group], tile, values)
                out[m0 + t, r] = finish(w row, tile, values)[t]

    A row's arithmetic does not depend on whether it sits in a tile, so each output row is the
    same whatever else is in the batch.
    """
    n_rows = f.let("sub i64 %r1, %r0")
    # tile stages, largest first: stage i takes as many tiles of tiles[i] rows as fit in what the
    # earlier stages left (M = 7 with (4, 2, 1): one tile of 4, one of 2, one single row)
    stages: list[tuple[int, str, str]] = []  # (rows per tile, first row, tile count)
    start, left = "0", "%M"
    for size in tiles:
        count = f.let(f"udiv i64 {left}, {size}")
        stages.append((size, start, count))
        start = f.add(start, f.mul(count, size))
        left = f.let(f"sub i64 %M, {start}")
    n_groups = f.let(f"udiv i64 {n_blocks}, {group}")
    left_start = f.mul(n_groups, group)
    n_left = f.let(f"sub i64 {n_blocks}, {left_start}")

    def per_row(ri: str, _: list[str]) -> list[str]:
        r = f.add("%r0", ri)
        w_row = f.gep("%w", f.mul(r, w_row_bytes))

        def tile(m0: str, rows: int) -> list[str]:
            t = _Tile(m0, rows)

            def blocks(first: str, size: int, values: list[str]) -> list[str]:
                idx = [first if g == 0 else f.add(first, g) for g in range(size)]
                wbs = [f.gep(w_row, f.mul(b, w_block_bytes)) for b in idx]
                if prefetch:
                    ahead = f.gep(wbs[0], PREFETCH_BYTES)
                    f.do(f"call void @llvm.prefetch.p0(ptr {ahead}, i32 0, i32 3, i32 1)")
                return block(wbs, idx, t, values)

            if prologue is not None:
                prologue(w_row, t)
            carried = accs(rows)
            types = [ty for ty, _ in carried]
            values = f.loop(n_groups, carried, lambda gi, v: blocks(f.mul(gi, group), group, v))
            if group > 1:
                values = f.loop(n_left, list(zip(types, values)),
                                lambda li, v: blocks(f.add(left_start, li), 1, v))
            for i, result in enumerate(finish(w_row, t, values)):
                idx = f.add(f.mul(f.add(m0, i), "%N"), r)
                dst = f.let(f"getelementptr inbounds float, ptr %out, i64 {idx}", "p")
                f.do(f"store float {result}, ptr {dst}, align 4")
            return []

        for size, first, count in stages:
            f.loop(count, [], lambda ti, _, size=size, first=first:
                   tile(f.add(first, f.mul(ti, size)), size))
        return []

    f.loop(n_rows, [], per_row)


# blocks folded into the accumulators at once (K-quant blocks are long enough alone)
GROUP = {T.Q4_0: 2, T.Q4_1: 2, T.Q5_0: 2, T.Q5_1: 2, T.Q8_0: 2, T.Q4_K: 1, T.Q5_K: 1, T.Q6_K: 1}


def build_matmul_ir(qtype: GGMLQuantizationType, portable: bool = False, vnni: bool = False,
                    tiles: tuple[int, ...] = TILES, wide: bool = False) -> str:
    """The IR module for one weight type (see the module docstring for its functions).

    Quantized types: rows_<type>(ptr w, ptr xq, ptr out, i64 nb, i64 r0, i64 r1, i64 M, i64 N)
    with nb = blocks per row, looping as _emit_rows shows; per block the type's body (docstrings
    of _LegacyTiles, _k4_5_body, _q6_k_body) unpacks the weights once and integer-dots them with
    each activation row's block; legacy types fold each block into the row's accumulators in
    llama.cpp's order, K-quants sum a block's terms and add them to the row's <8 x float>
    accumulator. The AVX2 path prefetches PREFETCH_BYTES ahead.

    Float types: rows_<type>(ptr w, ptr x, ptr out, i64 K, ...): the same nest over chunks of 16
    values (two <8 x float> FMA accumulators per activation row), then a scalar tail for K % 16.
    """
    if qtype not in SUPPORTED:
        raise ValueError(f"unsupported tensor type {getattr(qtype, 'name', qtype)}")
    act = activation_type(qtype)
    if act is None:
        return DECLARATIONS + _build_float_rows(qtype, tiles)
    name = qtype.name.lower()
    elems, block_bytes = GGML_QUANT_SIZES[qtype]
    assert ACTIVATION_BLOCK[act] == elems
    # (LLVM splits the 512-bit pair vectors into 256-bit halves here: asking for zmm registers
    # with "prefer-vector-width"="512" measured no faster on Zen 5, so the halves stay)
    f = _Fn(f"void @rows_{name}(ptr noalias %w, ptr noalias %xq, ptr noalias %out, i64 %nb, "
            f"i64 %r0, i64 %r1, i64 %M, i64 %N)")
    ops = _IntOps(f, avx2=not portable, vnni=vnni)
    prologue = None
    if qtype in LEGACY:
        legacy = _LegacyTiles(qtype, f, ops, max(tiles), block_bytes, wide)
        accs, block, finish, prologue = legacy.accs, legacy.block, legacy.finish, legacy.prologue
    else:
        body = _quant_body(qtype)

        def k_block(wbs: list[str], xss: list[list[str]], row_accs: list[list[str]]) -> list[list[str]]:
            per_block = [body(f, ops, wb, [xs[g] for xs in xss]) for g, wb in enumerate(wbs)]
            return [[_fold(f, [term for terms in per_block for term in terms[t]], acc[0])]
                    for t, acc in enumerate(row_accs)]

        x_block_bytes = ACTIVATION_LAYOUTS[act].itemsize  # q8_k: ggml's blocks, row by row
        accs, block, finish = _row_tiles(
            f, x_base="%xq", x_row_bytes=f.mul("%nb", x_block_bytes), x_block_bytes=x_block_bytes,
            acc_types=(V8F,), block=k_block, finish=lambda row_accs, _w, _x: f.hsum8(row_accs[0]))
    _emit_rows(f, n_blocks="%nb", w_block_bytes=block_bytes, w_row_bytes=f.mul("%nb", block_bytes),
               group=GROUP[qtype], accs=accs, block=block, finish=finish, prefetch=not portable,
               tiles=tiles, prologue=prologue)
    f.do("ret void")
    fused = (f"define void @matmul_{name}(ptr noalias %w, ptr noalias %x, ptr noalias %xq, "
             f"ptr noalias %out, i64 %nb, i64 %M, i64 %N) {{\n"
             f"entry:\n"
             f"  call void @quantize_{act}(ptr %x, ptr %xq, i64 %nb, i64 0, i64 %M, i64 %M)\n"
             f"  call void @rows_{name}(ptr %w, ptr %xq, ptr %out, i64 %nb, i64 0, i64 %N, "
             f"i64 %M, i64 %N)\n"
             f"  ret void\n}}\n")
    return DECLARATIONS + build_quantize_ir(act) + f.text() + fused


def _float_widen(f: _Fn, qtype: GGMLQuantizationType, base: str, offset: str | int, n: int) -> str:
    """Load n weights of a float type as <n x float> (n = 1: a scalar float)."""
    def vt(elem: str) -> str:
        return elem if n == 1 else f"<{n} x {elem}>"

    if qtype == T.F32:
        return f.load(vt("float"), base, offset)
    if qtype == T.F16:
        return f.let(f"fpext {vt('half')} {f.load(vt('half'), base, offset)} to {vt('float')}")
    # BF16 is the top half of an f32
    bits = f.let(f"zext {vt('i16')} {f.load(vt('i16'), base, offset)} to {vt('i32')}")
    shifted = f.let(f"shl {vt('i32')} {bits}, {16 if n == 1 else _splat('i32', n, 16)}")
    return f.let(f"bitcast {vt('i32')} {shifted} to {vt('float')}")


def _build_float_rows(qtype: GGMLQuantizationType, tiles: tuple[int, ...]) -> str:
    name = qtype.name.lower()
    esize = GGML_QUANT_SIZES[qtype][1]
    f = _Fn(f"void @rows_{name}(ptr noalias %w, ptr noalias %x, ptr noalias %out, i64 %K, "
            f"i64 %r0, i64 %r1, i64 %M, i64 %N)")
    n16 = f.let("udiv i64 %K, 16")
    tail0 = f.mul(n16, 16)
    n_tail = f.let(f"sub i64 %K, {tail0}")

    def block(wbs: list[str], xss: list[list[str]], row_accs: list[list[str]]) -> list[list[str]]:
        wv = [_float_widen(f, qtype, wbs[0], 8 * esize * h, 8) for h in range(2)]
        return [[f.let(f"call <8 x float> @llvm.fma.v8f32(<8 x float> {wv[h]}, "
                       f"<8 x float> {f.load(V8F, xs[0], 32 * h)}, <8 x float> {acc[h]})")
                 for h in range(2)]
                for xs, acc in zip(xss, row_accs)]

    def finish(row_accs: list[str], w_row: str, x_row: str) -> str:
        s = f.hsum8(f.let(f"fadd <8 x float> {row_accs[0]}, {row_accs[1]}"))

        def tail(i: str, carried: list[str]) -> list[str]:
            k = f.add(tail0, i)
            wv = _float_widen(f, qtype, w_row, f.mul(k, esize), 1)
            xv = f.load("float", x_row, f.mul(k, 4))
            return [f.let(f"call float @llvm.fma.f32(float {wv}, float {xv}, float {carried[0]})")]

        return f.loop(n_tail, [("float", s)], tail)[0]

    accs, tile_block, tile_finish = _row_tiles(f, x_base="%x", x_row_bytes=f.mul("%K", 4),
                                               x_block_bytes=64, acc_types=(V8F, V8F),
                                               block=block, finish=finish)
    _emit_rows(f, n_blocks=n16, w_block_bytes=16 * esize, w_row_bytes=f.mul("%K", esize),
               group=1, accs=accs, block=tile_block, finish=tile_finish, prefetch=False,
               tiles=tiles)
    f.do("ret void")
    return f.text()


# --- runtime facade ---------------------------------------------------------------------------

_F32 = np.dtype(np.float32)
_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p


# A split across the pool costs a dispatch (~2 us) and a barrier: worth it from ~256 KB of
# weight reads (about 15 us of one thread's work).
MIN_SPLIT_BYTES = 256 << 10


@dataclass(frozen=True)
class TypeKernels:
    """One weight type's compiled functions, as ctypes calls and as addresses (for task graphs)."""
    act: str | None
    block_elems: int
    rows: Callable[..., None]  # rows_<type>(w, x or xq, out, nb or K, r0, r1, M, N)
    fused: Callable[..., None] | None  # matmul_<type>(w, x, xq, out, nb, M, N)
    quantize: Callable[..., None] | None  # quantize_<act>(x, xq, nb, r0, r1, M)
    rows_address: int
    quantize_address: int  # 0 for float types

    def act_bytes(self, n_cols: int, m_rows: int) -> int:
        """Bytes of m_rows rows of activations as the rows kernel takes them (f32 for float types)."""
        if self.act is None:
            return 4 * n_cols * m_rows
        return packed_activation_bytes(self.act, n_cols, m_rows)


class MatmulKernels:
    """Compiled matmul kernels for a set of weight types; see the module docstring.

    Everything is compiled (or loaded from the disk cache) in the constructor, never later.
    Calls are serialized per instance (they share the activation scratch buffer and workers).
    Big matmuls are split by weight rows across `pool` (or a pool of n_threads of its own).
    """

    def __init__(self, qtypes: Iterable[GGMLQuantizationType], n_threads: int = 1,
                 portable: bool = False, pool: Pool | None = None, vnni: bool | None = None,
                 wide: bool | None = None) -> None:
        wanted = set(qtypes)
        for q in wanted:
            if q not in SUPPORTED:
                raise ValueError(f"unsupported tensor type {getattr(q, 'name', q)}")
        if n_threads < 1:
            raise ValueError(f"n_threads must be at least 1, got {n_threads}")
        self.portable = portable or not jit.host_has("avx2")
        # VNNI (AVX-512 VL or AVX-VNNI): one vpdpbusd for the u8 x s8 dot products
        host_vnni = jit.host_has("avxvnni") or (jit.host_has("avx512vnni") and jit.host_has("avx512vl"))
        self.vnni = not self.portable and host_vnni and vnni is not False
        # AVX-512 (byte ops, 512-bit vpdpbusd): pairs of activation rows share a register
        host_wide = all(jit.host_has(x) for x in ("avx512f", "avx512bw", "avx512vl", "avx512vnni"))
        self.wide = self.vnni and host_wide and wide is not False
        self.tiles = TILES if jit.host_has("avx512vl") and not self.portable else NARROW_TILES
        self._kernels = {q: self._load(q) for q in sorted(wanted, key=lambda t: t.value)}
        self._own_pool = pool is None and n_threads > 1
        self._pool = Pool(n_threads) if self._own_pool else pool
        self.n_threads = self._pool.n_threads if self._pool is not None else 1
        # the task that splits a matmul across the pool, compiled now rather than at the first split
        self._split_task = (tasks.load_tasks(jit.host_has("f16c")).address["task_matmul"]
                            if self._pool is not None else 0)
        self._step = np.zeros(len(tasks.STEP.fields), np.int64)  # a STEP block: n_tokens is M
        self._step_address = address(self._step)
        self._lock = threading.Lock()
        self._scratch = np.empty(0, np.uint8)
        self._scratch_address = 0

    def _load(self, qtype: GGMLQuantizationType) -> TypeKernels:
        lib = jit.compile_cached("matmul", (qtype.name, self.portable, self.vnni, self.tiles, self.wide),
                                 lambda: build_matmul_ir(qtype, self.portable, self.vnni, self.tiles,
                                                         self.wide))
        name = qtype.name.lower()
        act = activation_type(qtype)
        rows = lib.function(f"rows_{name}", None, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64)
        rows_address = lib.address(f"rows_{name}")
        if act is None:
            return TypeKernels(None, 1, rows, None, None, rows_address, 0)
        fused = lib.function(f"matmul_{name}", None, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64)
        quantize = lib.function(f"quantize_{act}", None, _PTR, _PTR, _I64, _I64, _I64, _I64)
        return TypeKernels(act, GGML_QUANT_SIZES[qtype][0], rows, fused, quantize, rows_address,
                           lib.address(f"quantize_{act}"))

    def kernels(self, qtype: GGMLQuantizationType) -> TypeKernels:
        k = self._kernels.get(qtype)
        if k is None:
            raise ValueError(f"no kernel compiled for {qtype.name}; this instance has "
                             f"{', '.join(sorted(t.name for t in self._kernels))}")
        return k

    def _scratch_for(self, nbytes: int) -> int:
        if self._scratch.nbytes < nbytes:
            self._scratch = empty_packed(max(nbytes, 2 * self._scratch.nbytes))
            self._scratch_address = int(self._scratch.ctypes.data)
        return self._scratch_address

    @staticmethod
    def _activations(x: np.ndarray, n_cols: int) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise ValueError(f"activations must be a numpy array, got {type(x).__name__}")
        if x.ndim != 2 or x.shape[1] != n_cols or x.shape[0] < 1:
            raise ValueError(f"activations must have shape [M >= 1, {n_cols}], got {x.shape}")
        if x.dtype != _F32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        return x

    def matmul(self, w: QuantMatrix, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """out[m, r] = dot(W[r, :], x[m, :]) for x float32 [M, K]; returns float32 [M, N]."""
        k = self.kernels(w.qtype)
        x = self._activations(x, w.n_cols)
        m, n = x.shape[0], w.n_rows
        if out is None:
            out = np.empty((m, n), _F32)
        elif (not isinstance(out, np.ndarray) or out.shape != (m, n) or out.dtype != _F32
              or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"out must be a writable C-contiguous float32 array of shape {(m, n)}")
        x_addr, out_addr = address(x), address(out)
        with self._lock:
            split = (self._pool is not None and self.n_threads > 1 and n > 1
                     and w.nbytes * m >= MIN_SPLIT_BYTES)
            if k.act is None:  # float weights: x goes in as is; "blocks" are values
                if not split:
                    k.rows(w.address, x_addr, out_addr, w.n_cols, 0, n, m, n)
                    return out
                self._run_split(k, w, x_addr, out_addr, w.n_cols, m)
                return out
            nb = w.n_cols // k.block_elems
            xq = self._scratch_for(k.act_bytes(w.n_cols, m))
            if not split:
                assert k.fused is not None
                k.fused(w.address, x_addr, xq, out_addr, nb, m, n)
            else:
                assert k.quantize is not None
                k.quantize(x_addr, xq, nb, 0, m, m)
                self._run_split(k, w, xq, out_addr, nb, m)
        return out

    def _run_split(self, k: TypeKernels, w: QuantMatrix, x_addr: int, out_addr: int, nb: int,
                   m: int) -> None:
        assert self._pool is not None
        tasks.STEP.fill(self._step, n_tokens=m)
        args = tasks.MATMUL.pack(fn=k.rows_address, w=w.address, x=x_addr, out=out_addr, nb=nb,
                                 n_rows=w.n_rows, m_at=tasks.M_TOKENS)
        self._pool.run_task(self._split_task, args, self._step_address)

    def quantize(self, x: np.ndarray, act: str, r0: int = 0, r1: int | None = None,
                 into: np.ndarray | None = None) -> np.ndarray:
        """The compiled activation quantizer (for tests): rows [r0, r1) of x, float32 [M, K],
        into `into` (or a fresh zeroed buffer): uint8 [M * packed row bytes], laid out as
        engine.quants.pack_activations."""
        quantizers = {k.act: k.quantize for k in self._kernels.values() if k.act is not None}
        fn = quantizers.get(act)
        if fn is None:
            raise ValueError(f"no {act} quantizer compiled here (have {sorted(quantizers)})")
        if not isinstance(x, np.ndarray) or x.ndim != 2:
            raise ValueError("activations must be a 2-D numpy array [M, K]")
        m = x.shape[0]
        r1 = m if r1 is None else r1
        if not 0 <= r0 <= r1 <= m:
            raise ValueError(f"row range [{r0}, {r1}) is not within [0, {m}]")
        size = packed_activation_bytes(act, x.shape[1], m)
        x = self._activations(x, x.shape[1])
        if into is None:
            into = np.zeros(size, np.uint8)
        elif into.shape != (size,) or into.dtype != np.uint8 or not into.flags.c_contiguous:
            raise ValueError(f"into must be a contiguous uint8 array of {size} bytes")
        fn(address(x), address(into), x.shape[1] // ACTIVATION_BLOCK[act], r0, r1, m)
        return into

    def close(self) -> None:
        if self._own_pool and self._pool is not None:
            self._pool.close()
        self._pool = None

    def __enter__(self) -> MatmulKernels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def matmul_reference(w: QuantMatrix, x: np.ndarray) -> np.ndarray:
    """Numpy twin of MatmulKernels.matmul: dequantize(W) @ (activations as the kernel sees
    them).T, in float64, returned as float32 [M, N]."""
    x = np.asarray(x, dtype=np.float32)
    act = activation_type(w.qtype)
    if act is None:
        xs = x
    else:
        blocks = quantize_activations(x, act)  # [M, row bytes], ggml's blocks
        xs = dequantize_activations(blocks, act, w.n_cols)
    wd = dequantize(w.raw, w.qtype, w.n_cols).astype(np.float64)  # [N, K]
    y = xs.astype(np.float64) @ wd.T                               # [M, N]
    if act == "q8_1":
        # The kernel adds each weight block's offset (m, or -8d / -16d) times the activation
        # block's stored s = f16(d * sum(q)), not times the exact d * sum(q) that xs implies.
        b = blocks.view(ACTIVATION_LAYOUTS[act]).reshape(x.shape[0], -1)   # [M, nb]
        delta = b["s"].astype(np.float64) - (b["d"].astype(np.float64)
                                             * b["qs"].astype(np.int64).sum(axis=-1))
        y += delta @ _block_offsets(w).T
    return y.astype(np.float32)


def _block_offsets(w: QuantMatrix) -> np.ndarray:
    """float64 [N, nb]: the constant each 32-block of a Q4_0/Q4_1/Q5_0/Q5_1 row adds per value."""
    b = w.raw.view(WEIGHT_LAYOUTS[w.qtype]).reshape(w.n_rows, -1)
    if w.qtype in (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_1):
        return b["m"].astype(np.float64)
    offset = 8.0 if w.qtype == GGMLQuantizationType.Q4_0 else 16.0
    return -offset * b["d"].astype(np.float64)
