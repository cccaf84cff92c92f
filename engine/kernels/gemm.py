"""Row-interleaved quantized matmul kernels (decode and prefill): LLVM IR builders.

    out[m, r] = dot(W[r, :], x[m, :])   W: engine.repack.RepackedMatrix [N, K]   x: [M, K]

engine/repack.py has the layouts and the arithmetic. Per weight type the module holds
    quantize_<act>(x, xq, nb, r0, r1, M)          rows [r0, r1) of f32 [M, K] -> act rows
    gemm_<type>(w, xq, out, nb, r0, r1, M, N)     weight rows [r0, r1) against all M rows
the same signatures as engine.kernels.matmul's quantize_/rows_ functions, so the task graph
runs either. A thread's rows are rounded up to whole groups of 16 ([ceil16(r0), ceil16(r1)):
consecutive ranges stay disjoint and cover [0, N)), so callers split anywhere.

The loop nest: for each group of 16 weight rows, for each tile of TILES[type] activation rows
(then single rows), for each block: unpack the 16 rows' block (registers), then for each tile
row take the integer dot products with 4-byte activation broadcasts (`vpdpbusd` adds four u8 x
i8 products into each row's lane), scale and accumulate per block. A tile's accumulators live
in registers; the group's weights stay in L1/L2 while all M activation rows stream past them,
so weights are read from memory once per call. The K-quants keep LANES = 8 accumulators per
activation row: lane i gathers what lane i of the file-layout kernel gathers (chunk i of each
32-value group), so the float operations and their order are that kernel's (FILE_LAYOUT_BITS).

Instruction selections (the same integers everywhere, so all give the same bits):
  vnni512   `vpdpbusd` / `vpdpwssd` on 512-bit vectors (AVX-512 VNNI + BW)
  avx2      `vpmaddubsw` + `vpmaddwd` per 256-bit half: exact because every u8 weight operand
            of the AVX2 path is < 64 (maddubs never saturates); Q8_0's u8 weights reach 255,
            so Q8_0 has no AVX2 form here (the file-layout kernels serve it)
  portable  the same sums in generic vector IR
"""
from __future__ import annotations

from collections.abc import Callable

from engine.kernels.irtext import IRFunction
from engine.repack import ACT_BLOCK, ACTIVATION, GROUP_BLOCK_BYTES, ROWS, T

# activation rows per register tile: a tile row keeps LANES[type] accumulators of 16 rows
TILES = {T.Q8_0: 4, T.Q5_0: 4, T.Q4_1: 4, T.Q5_1: 4, T.Q4_K: 1, T.Q6_K: 1}  # (K-quants: 2 or 4 spill, measured no faster)
# (no software prefetch: 1-8 blocks ahead, to L1 or L2, measured 10-35% slower from DRAM)
ISAS = ("vnni512", "avx2", "portable")
V16F, V16I = "<16 x float>", "<16 x i32>"

DECLARATIONS = """
declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)
declare <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32>, <16 x i32>, <16 x i32>)
declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)
declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
declare <32 x float> @llvm.fabs.v32f32(<32 x float>)
declare <32 x float> @llvm.roundeven.v32f32(<32 x float>)
declare float @llvm.vector.reduce.fmax.v32f32(<32 x float>)
declare float @llvm.maxnum.f32(float, float)
declare float @llvm.fabs.f32(float)
declare i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)
declare i32 @llvm.vector.reduce.add.v32i32(<32 x i32>)
"""


def _vec(elem: str, values: list[int]) -> str:
    return "<" + ", ".join(f"{elem} {v}" for v in values) + ">"


def _splat_i8(n: int, v: int) -> str:
    return _vec("i8", [v - 256 if v > 127 else v] * n)


def _vec_i32(v: int) -> str:
    return _vec("i32", [v] * 16)


def _mask(idx: list[int]) -> str:
    return f"<{len(idx)} x i32> " + _vec("i32", idx)


class _Fn(IRFunction):
    def splat_i32(self, v: str) -> str:
        s = self.let(f"insertelement {V16I} poison, i32 {v}, i64 0")
        return self.let(f"shufflevector {V16I} {s}, {V16I} poison, <16 x i32> zeroinitializer")

    def bcast(self, base: str, offset: int | str) -> str:
        """The i32 at base + offset in every lane (x86: an embedded {1to16} broadcast)."""
        return self.splat_i32(self.load("i32", base, offset, 4))

    def half16(self, base: str, offset: int) -> str:
        h = self.load("<16 x half>", base, offset, 2)
        return self.let(f"fpext <16 x half> {h} to {V16F}")

    def widen16(self, base: str, offset: int | str, signed: bool) -> str:
        """16 bytes -> <16 x i32>, zero- or sign-extended."""
        v = self.load("<16 x i8>", base, offset)
        return self.let(f"{'sext' if signed else 'zext'} <16 x i8> {v} to {V16I}")

    def fma16(self, a: str, b: str, c: str) -> str:
        return self.let(f"call {V16F} @llvm.fma.v16f32({V16F} {a}, {V16F} {b}, {V16F} {c})")

    def tofloat(self, v: str) -> str:
        return self.let(f"sitofp {V16I} {v} to {V16F}")


class _Dots:
    """dot(acc, u, s): acc + per lane the sum of four u8 x i8 products (u <64 x i8> weights,
    unsigned; s <16 x i32> activation bytes, signed). wdot(acc, a, b): acc + per lane the sum of
    two i16 x i16 products."""

    def __init__(self, f: _Fn, isa: str) -> None:
        assert isa in ISAS
        self.f, self.isa = f, isa

    def _avx2_halves(self, acc: str, a: str, b: str, elem: str,
                     half: Callable[[str, str], str]) -> str:
        """acc + the two 256-bit halves' half(a_h, b_h) (<8 x i32> each), side by side."""
        f = self.f
        n = 64 if elem == "i8" else 32
        parts = []
        for h in range(2):
            m = _mask(list(range(n // 2 * h, n // 2 * (h + 1))))
            ah, bh = (f.let(f"shufflevector <{n} x {elem}> {v}, <{n} x {elem}> poison, {m}") for v in (a, b))
            parts.append(half(ah, bh))
        both = f.let(f"shufflevector <8 x i32> {parts[0]}, <8 x i32> {parts[1]}, {_mask(list(range(16)))}")
        return f.let(f"add {V16I} {acc}, {both}")

    def _sum_groups(self, v: str, n: int, k: int) -> str:
        """<n*k x i32> -> <n x i32>: sums of k consecutive lanes."""
        f = self.f
        parts = [f.let(f"shufflevector <{n * k} x i32> {v}, <{n * k} x i32> poison, "
                       f"{_mask(list(range(j, n * k, k)))}") for j in range(k)]
        total = parts[0]
        for p in parts[1:]:
            total = f.let(f"add <{n} x i32> {total}, {p}")
        return total

    def dot(self, acc: str, u: str, s: str) -> str:
        f = self.f
        if self.isa == "vnni512":
            u32 = f.let(f"bitcast <64 x i8> {u} to {V16I}")
            return f.let(f"call {V16I} @llvm.x86.avx512.vpdpbusd.512({V16I} {acc}, {V16I} {u32}, "
                         f"{V16I} {s})")
        s8 = f.let(f"bitcast {V16I} {s} to <64 x i8>")
        if self.isa == "avx2":
            ones = _vec("i16", [1] * 16)
            return self._avx2_halves(acc, u, s8, "i8", lambda uh, sh: f.let(
                f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> "
                f"{f.let(f'call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {uh}, <32 x i8> {sh})')}, "
                f"<16 x i16> {ones})"))
        uw = f.let(f"zext <64 x i8> {u} to <64 x i32>")
        sw = f.let(f"sext <64 x i8> {s8} to <64 x i32>")
        prod = f.let(f"mul <64 x i32> {uw}, {sw}")
        return f.let(f"add {V16I} {acc}, {self._sum_groups(prod, 16, 4)}")

    def scale(self, v: str) -> str:
        """A <16 x i32> of 16-bit-range multipliers in the form `scaled` takes (VNNI: the value
        in each lane's low i16, zero above, so vpdpwssd's second product vanishes)."""
        if self.isa != "vnni512":
            return v
        return self.f.let(f"and {V16I} {v}, {_vec('i32', [0xFFFF] * 16)}")

    def scaled(self, acc: str, d: str, sc: str) -> str:
        """acc + d * sc per lane, for d within i16 and sc from `scale` (exact either way)."""
        if self.isa == "vnni512":
            return self.wdot(acc, d, sc)
        return self.f.let(f"add {V16I} {acc}, {self.f.let(f'mul {V16I} {d}, {sc}')}")

    def wdot(self, acc: str, a: str, b: str) -> str:
        f = self.f
        if self.isa == "vnni512":
            return f.let(f"call {V16I} @llvm.x86.avx512.vpdpwssd.512({V16I} {acc}, {V16I} {a}, {V16I} {b})")
        a16 = f.let(f"bitcast {V16I} {a} to <32 x i16>")
        b16 = f.let(f"bitcast {V16I} {b} to <32 x i16>")
        if self.isa == "avx2":
            return self._avx2_halves(acc, a16, b16, "i16", lambda ah, bh: f.let(
                f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {ah}, <16 x i16> {bh})"))
        aw = f.let(f"sext <32 x i16> {a16} to <32 x i32>")
        bw = f.let(f"sext <32 x i16> {b16} to <32 x i32>")
        prod = f.let(f"mul <32 x i32> {aw}, {bw}")
        return f.let(f"add {V16I} {acc}, {self._sum_groups(prod, 16, 2)}")


class _Act:
    """Addresses in an activation row (engine.repack: qs | d | c (r8_0) or c16 | b32 (r8_k))."""

    def __init__(self, f: _Fn, act: str) -> None:
        self.f, self.act = f, act
        elems = ACT_BLOCK[act]
        self.k = f.mul("%nb", elems)
        raw = f.mul("%nb", elems + (84 if act == "r8_k" else 8))
        self.stride = f.let(f"and i64 {f.add(raw, 63)}, -64")
        self.d_at = self.k
        self.c_at = f.add(self.k, f.mul("%nb", 4))       # r8_0: c; r8_1: s; r8_k: c16
        self.b32_at = f.add(self.k, f.mul("%nb", 68))    # r8_k only

    def row(self, m: str) -> str:
        return self.f.gep("%xq", self.f.mul(m, self.stride))


# A body folds one block of 16 weight rows into each tile row's accumulators: accs[t] holds
# LANES[type] <16 x float> vectors (see the module docstring), returned updated.
_Body = Callable[[_Fn, _Dots, _Act, str, str, list[str], list[list[str]]], list[list[str]]]


def _body_q8_0(f: _Fn, dots: _Dots, act: _Act, wb: str, b: str, xs: list[str],
               accs: list[list[str]]) -> list[list[str]]:
    isums = [f.bcast(x, f.add(act.c_at, f.mul(b, 4))) for x in xs]   # -128 * sum(y)
    qs = f.mul(b, 32)
    for k in range(8):
        u = f.load("<64 x i8>", wb, 64 * k)
        isums = [dots.dot(acc, u, f.bcast(x, f.add(qs, 4 * k))) for acc, x in zip(isums, xs)]
    dw = f.half16(wb, 512)
    out = []
    for acc, isum, x in zip(accs, isums, xs):
        dx = f.splat_float(f.load("float", x, f.add(act.d_at, f.mul(b, 4)), 4), 16)
        out.append([f.fma16(f.let(f"fmul {V16F} {dw}, {dx}"), f.tofloat(isum), acc[0])])
    return out


def _q5_top_bits(f: _Fn, qh: str, first: int) -> str:
    """Bits first..first+3 of each lane's qh, as bit 4 of its four bytes (a multiply spreads
    4 bits to bytes 0..3: x * 0x204081 is x | x << 7 | x << 14 | x << 21, no carries)."""
    t = f.let(f"and {V16I} {f.let(f'lshr {V16I} {qh}, {_vec_i32(first)}') if first else qh}, {_vec_i32(15)}")
    t = f.let(f"mul {V16I} {t}, {_vec_i32(0x204081 << 4)}")
    return f.let(f"bitcast {V16I} {f.let(f'and {V16I} {t}, {_vec_i32(0x10101010)}')} to <64 x i8>")


def _body_q5_0(f: _Fn, dots: _Dots, act: _Act, wb: str, b: str, xs: list[str],
               accs: list[list[str]]) -> list[list[str]]:
    """As Q8_0 with q = nibble | 5th bit << 4 (unsigned, 0..31) and the offset -16 * sum(y)
    (the r8_0 row's c / 8, exact) as the starting value."""
    qh = f.load(V16I, wb, 256)
    chunks: list[str] = [""] * 8
    for k in range(4):
        v = f.load("<64 x i8>", wb, 64 * k)
        lo = f.let(f"and <64 x i8> {v}, {_splat_i8(64, 15)}")
        hi = f.let(f"lshr <64 x i8> {v}, {_splat_i8(64, 4)}")
        chunks[k] = f.let(f"or <64 x i8> {lo}, {_q5_top_bits(f, qh, 4 * k)}")
        chunks[k + 4] = f.let(f"or <64 x i8> {hi}, {_q5_top_bits(f, qh, 16 + 4 * k)}")
    qs = f.mul(b, 32)
    dw = f.half16(wb, 320)
    out = []
    for acc, x in zip(accs, xs):
        c = f.let(f"ashr {V16I} {f.bcast(x, f.add(act.c_at, f.mul(b, 4)))}, {_vec_i32(3)}")
        for k in range(8):
            c = dots.dot(c, chunks[k], f.bcast(x, f.add(qs, 4 * k)))
        out.append([f.fma16(_x_scale(f, act, x, b, dw), f.tofloat(c), acc[0])])
    return out


def _legacy_chunks(f: _Fn, wb: str, qh_at: int | None) -> list[str]:
    """Q5_0/Q4_1/Q5_1's 8 chunks of unsigned values (nibble, | 5th bit << 4 with qh)."""
    qh = f.load(V16I, wb, qh_at) if qh_at is not None else None
    chunks: list[str] = [""] * 8
    for k in range(4):
        v = f.load("<64 x i8>", wb, 64 * k)
        lo = f.let(f"and <64 x i8> {v}, {_splat_i8(64, 15)}")
        hi = f.let(f"lshr <64 x i8> {v}, {_splat_i8(64, 4)}")
        if qh is not None:
            lo = f.let(f"or <64 x i8> {lo}, {_q5_top_bits(f, qh, 4 * k)}")
            hi = f.let(f"or <64 x i8> {hi}, {_q5_top_bits(f, qh, 16 + 4 * k)}")
        chunks[k], chunks[k + 4] = lo, hi
    return chunks


def _body_q4_5_1(f: _Fn, dots: _Dots, act: _Act, wb: str, b: str, xs: list[str],
                 accs: list[list[str]], qh_at: int | None) -> list[list[str]]:
    """Q4_1/Q5_1 (d * q + m) against r8_1: acc = fma(d * dx, float(sum q * y), acc), then
    fma(m, s, acc) with s = dx * sum(y) (ggml's q8_1 s)."""
    chunks = _legacy_chunks(f, wb, qh_at)
    at = 256 + (64 if qh_at is not None else 0)
    dw, mw = f.half16(wb, at), f.half16(wb, at + 32)
    qs = f.mul(b, 32)
    out = []
    for acc, x in zip(accs, xs):
        isum = "zeroinitializer"
        for k in range(8):
            isum = dots.dot(isum, chunks[k], f.bcast(x, f.add(qs, 4 * k)))
        acc0 = f.fma16(_x_scale(f, act, x, b, dw), f.tofloat(isum), acc[0])
        sx = f.splat_float(f.load("float", x, f.add(act.c_at, f.mul(b, 4)), 4), 16)
        out.append([f.fma16(mw, sx, acc0)])
    return out


def _body_q4_1(f: _Fn, dots: _Dots, act: _Act, wb: str, b: str, xs: list[str],
               accs: list[list[str]]) -> list[list[str]]:
    return _body_q4_5_1(f, dots, act, wb, b, xs, accs, None)


def _body_q5_1(f: _Fn, dots: _Dots, act: _Act, wb: str, b: str, xs: list[str],
               accs: list[list[str]]) -> list[list[str]]:
    return _body_q4_5_1(f, dots, act, wb, b, xs, accs, 256)


def _fold(f: _Fn, acc: str, isum: str, ddx: str, mins: tuple[str, str] | None = None) -> str:
    """acc + (float(isum) * ddx [+ float(minsum) * neg_dmdx, fused]): kquants.fold's order;
    mins = (minsum, neg_dmdx)."""
    part = f.let(f"fmul {V16F} {f.tofloat(isum)}, {ddx}")
    if mins is not None:
        part = f.fma16(f.tofloat(mins[0]), mins[1], part)
    return f.let(f"fadd {V16F} {acc}, {part}")


def _x_scale(f: _Fn, act: _Act, x: str, b: str, w_scale: str) -> str:
    """w_scale * dx[b] for one activation row (16 weight rows' products)."""
    dx = f.splat_float(f.load("float", x, f.add(act.d_at, f.mul(b, 4)), 4), 16)
    return f.let(f"fmul {V16F} {w_scale}, {dx}")


def _body_q4_k(f: _Fn, dots: _Dots, act: _Act, wb: str, b: str, xs: list[str],
               accs: list[list[str]]) -> list[list[str]]:
    """Lane i of the file-layout kernel (kquants.q4_5_k_body) is, per row, sum_j sc_j * (dot
    of values 4i..4i+3 of sub-block j) and mn_i * (sum of sub-block i's activations): here
    accumulator i of a tile row, for 16 rows at once, then folded as kquants.fold does."""
    qs = f.mul(b, 256)
    b32 = f.add(act.b32_at, f.mul(b, 16))
    sc = [dots.scale(f.widen16(wb, 64 + 16 * j, signed=False)) for j in range(8)]
    dw, dmin = f.half16(wb, 0), f.half16(wb, 32)
    ddx = [_x_scale(f, act, x, b, dw) for x in xs]
    ndm = [f.let(f"fneg {V16F} {_x_scale(f, act, x, b, dmin)}") for x in xs]
    out = [list(a) for a in accs]
    for i in range(8):
        vs = [f.load("<64 x i8>", wb, 320 + 512 * p + 64 * i) for p in range(4)]
        nib = [(f.let(f"and <64 x i8> {v}, {_splat_i8(64, 15)}"),
                f.let(f"lshr <64 x i8> {v}, {_splat_i8(64, 4)}")) for v in vs]
        mn = dots.scale(f.widen16(wb, 192 + 16 * i, signed=False))
        for t, x in enumerate(xs):
            isum = "zeroinitializer"
            for p in range(4):
                for h in range(2):
                    d = dots.dot("zeroinitializer", nib[p][h], f.bcast(x, f.add(qs, 64 * p + 32 * h + 4 * i)))
                    isum = dots.scaled(isum, d, sc[2 * p + h])
            bsum = f.let(f"sext i16 {f.load('i16', x, f.add(b32, 2 * i), 2)} to i32")
            minsum = dots.scaled("zeroinitializer", f.splat_i32(bsum), mn)
            out[t][i] = _fold(f, out[t][i], isum, ddx[t], (minsum, ndm[t]))
    return out


def _q6_field(f: _Fn, h: str, k: int) -> str:
    """2-bit field k of each byte of h, moved to bits 4..5."""
    if k < 2:
        h = f.let(f"shl <64 x i8> {h}, {_splat_i8(64, 4 - 2 * k)}")
    elif k == 3:
        h = f.let(f"lshr <64 x i8> {h}, {_splat_i8(64, 2)}")
    return f.let(f"and <64 x i8> {h}, {_splat_i8(64, 0x30)}")


def _body_q6_k(f: _Fn, dots: _Dots, act: _Act, wb: str, b: str, xs: list[str],
               accs: list[list[str]]) -> list[list[str]]:
    """Lane k = 4a + i of the file-layout kernel (kquants.q6_k_body) is, per row, sum over the
    chunks c = 8m + k (values 4c..4c+3; sub-block c // 4) of sc * dot, less 32 * (sub-blocks
    2k and 2k+1's scales times activation sums). Those chunks sit in steps s = a, a+2, a+4,
    a+6 of the repacked block, ql vector i (chunk 4s+i, high nibble 32+4s+i)."""
    qs = f.mul(b, 256)
    c16 = f.add(act.c_at, f.mul(b, 64))
    sc_raw = [f.widen16(wb, 32 + 16 * j, signed=True) for j in range(16)]
    sc = [dots.scale(v) for v in sc_raw]
    dw = f.half16(wb, 0)
    ddx = [_x_scale(f, act, x, b, dw) for x in xs]
    out = [list(a) for a in accs]
    for k in range(8):
        a, i = divmod(k, 4)
        p, c = divmod(i, 2)
        chunks = []  # (weights, chunk index) of this lane
        for s in range(a, 8, 2):
            ql = f.load("<64 x i8>", wb, 288 + 384 * s + 64 * i)
            qh = f.load("<64 x i8>", wb, 288 + 384 * s + 256 + 64 * p)
            lo = f.let(f"and <64 x i8> {ql}, {_splat_i8(64, 15)}")
            hi = f.let(f"lshr <64 x i8> {ql}, {_splat_i8(64, 4)}")
            chunks.append((f.let(f"or <64 x i8> {lo}, {_q6_field(f, qh, c)}"), 4 * s + i))
            chunks.append((f.let(f"or <64 x i8> {hi}, {_q6_field(f, qh, 2 + c)}"), 32 + 4 * s + i))
        for t, x in enumerate(xs):
            isum = "zeroinitializer"
            for u, ch in chunks:
                isum = dots.scaled(isum, dots.dot("zeroinitializer", u, f.bcast(x, f.add(qs, 4 * ch))),
                                   sc[ch // 4])
            for j in (2 * k, 2 * k + 1):  # -32 * bsum_j * sc_j (too wide for i16 products)
                corr = f.let(f"mul {V16I} {f.bcast(x, f.add(c16, 4 * j))}, {sc_raw[j]}")
                isum = f.let(f"add {V16I} {isum}, {corr}")
            out[t][k] = _fold(f, out[t][k], isum, ddx[t])
    return out


BODIES: dict[T, _Body] = {T.Q8_0: _body_q8_0, T.Q5_0: _body_q5_0, T.Q4_1: _body_q4_1,
                          T.Q5_1: _body_q5_1, T.Q4_K: _body_q4_k, T.Q6_K: _body_q6_k}
# accumulators per (16 weight rows, activation row): the file-layout kernel's float lanes
LANES = {T.Q8_0: 1, T.Q5_0: 1, T.Q4_1: 1, T.Q5_1: 1, T.Q4_K: 8, T.Q6_K: 8}
# the types whose results are the file-layout kernels' bits (tests/test_gemm.py asserts it)
FILE_LAYOUT_BITS = frozenset({T.Q4_K, T.Q6_K})


def supported(qtype: T, isa: str) -> bool:
    """Whether this module has a kernel for qtype on isa (AVX2 maddubs would saturate on Q8_0)."""
    return qtype in BODIES and not (qtype == T.Q8_0 and isa == "avx2")


def _lane_sum(f: _Fn, v: list[str]) -> str:
    """The lanes' total in isa.hsum_halves' order: ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))."""
    if len(v) == 1:
        return v[0]
    r = [f.let(f"fadd {V16F} {v[i]}, {v[i + 4]}") for i in range(4)]
    s = [f.let(f"fadd {V16F} {r[i]}, {r[i + 2]}") for i in range(2)]
    return f.let(f"fadd {V16F} {s[0]}, {s[1]}")


def _build_gemm(qtype: T, isa: str, tile: int) -> str:
    name = qtype.name.lower()
    f = _Fn(f"void @gemm_{name}(ptr noalias %w, ptr noalias %xq, ptr noalias %out, i64 %nb, "
            f"i64 %r0, i64 %r1, i64 %M, i64 %N)")
    dots = _Dots(f, isa)
    act = _Act(f, ACTIVATION[qtype])
    body, lanes = BODIES[qtype], LANES[qtype]
    g0 = f.let(f"lshr i64 {f.add('%r0', ROWS - 1)}, 4")
    g1 = f.let(f"lshr i64 {f.add('%r1', ROWS - 1)}, 4")
    group_bytes = f.mul("%nb", GROUP_BLOCK_BYTES[qtype])
    n_tiles = f.let(f"udiv i64 %M, {tile}")
    rest0 = f.mul(n_tiles, tile)

    def group(g: str) -> None:
        wg = f.gep("%w", f.mul(g, group_bytes))
        col = f.mul(g, ROWS)

        def tile_rows(m0: str, rows: int) -> None:
            xs = [act.row(f.add(m0, t)) for t in range(rows)]

            def block(b: str, flat: list[str]) -> list[str]:
                wb = f.gep(wg, f.mul(b, GROUP_BLOCK_BYTES[qtype]))
                accs = [flat[lanes * t:lanes * (t + 1)] for t in range(rows)]
                return [v for row in body(f, dots, act, wb, b, xs, accs) for v in row]

            flat = f.loop("%nb", [(V16F, "zeroinitializer")] * (rows * lanes), block)
            for t in range(rows):
                acc = _lane_sum(f, flat[lanes * t:lanes * (t + 1)])
                at = f.add(f.mul(f.add(m0, t), "%N"), col)
                f.store(V16F, acc, f.gep("%out", f.mul(at, 4)), 0, 4)

        def full_tile(i: str, _: list[str]) -> list[str]:
            tile_rows(f.mul(i, tile), tile)
            return []

        f.loop(n_tiles, [], full_tile)
        f.loop_range(rest0, "%M", lambda m: tile_rows(m, 1))

    f.loop_range(g0, g1, group)
    f.do("ret void")
    return f.text()


# --- activation quantizers --------------------------------------------------------------------

def _absmax(f: _Fn, src: str, n_chunks: int) -> str:
    amax = None
    for c in range(n_chunks):
        v = f.load("<32 x float>", src, 128 * c, 4)
        m = f.let(f"call float @llvm.vector.reduce.fmax.v32f32(<32 x float> "
                  f"{f.let(f'call <32 x float> @llvm.fabs.v32f32(<32 x float> {v})')})")
        amax = m if amax is None else f.let(f"call float @llvm.maxnum.f32(float {amax}, float {m})")
    assert amax is not None
    return amax


def _quantize_chunk(f: _Fn, src: str, dst: str, inv: str) -> str:
    """32 floats * inv, rounded half-even, stored as i8; returns them as <32 x i32>."""
    v = f.load("<32 x float>", src, 0, 4)
    r = f.let(f"call <32 x float> @llvm.roundeven.v32f32(<32 x float> "
              f"{f.let(f'fmul <32 x float> {v}, {f.splat_float(inv, 32)}')})")
    q = f.let(f"fptosi <32 x float> {r} to <32 x i32>")
    f.store("<32 x i8>", f.let(f"trunc <32 x i32> {q} to <32 x i8>"), dst)
    return q


def _round_half(f: _Fn, v: str) -> str:
    """v rounded to the nearest f16 value, kept as float; beyond f16's range v itself
    (engine.activations._round_to_half)."""
    r = f.let(f"fpext half {f.let(f'fptrunc float {v} to half')} to float")
    big = f.let(f"fcmp ogt float {f.let(f'call float @llvm.fabs.f32(float {v})')}, 65504.0")
    return f.let(f"select i1 {big}, float {v}, float {r}")


def _build_quantize(act: str) -> str:
    """quantize_<act>(x, xq, nb, r0, r1, M): as ggml's q8_0 / q8_k (d = max|x| / 127,
    q = roundeven(x * (127 / max|x|)), 0 for an all-zero block), laid out as engine.repack says."""
    elems = ACT_BLOCK[act]
    f = _Fn(f"void @quantize_{act}(ptr noalias %x, ptr noalias %xq, i64 %nb, i64 %r0, i64 %r1, i64 %M)")
    a = _Act(f, act)

    def per_block(m: str, j: str) -> None:
        src = f.gep("%x", f.mul(f.add(f.mul(m, "%nb"), j), 4 * elems))
        row = a.row(m)
        amax = _absmax(f, src, elems // 32)
        d = f.let(f"fdiv float {amax}, 127.0")
        nonzero = f.let(f"fcmp one float {amax}, 0.0")
        inv = f.let(f"select i1 {nonzero}, float {f.let(f'fdiv float 127.0, {amax}')}, float 0.0")
        qs = f.gep(row, f.mul(j, elems))
        if act == "r8_1":  # d and s = d * sum(q), each rounded to f16 (kept as is beyond it)
            q = _quantize_chunk(f, src, qs, inv)
            total = f.let(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {q})")
            sv = f.let(f"fmul float {d}, {f.let(f'sitofp i32 {total} to float')}")
            f.store("float", _round_half(f, d), row, f.add(a.d_at, f.mul(j, 4)), 4)
            f.store("float", _round_half(f, sv), row, f.add(a.c_at, f.mul(j, 4)), 4)
            return
        if act == "r8_0":
            q = _quantize_chunk(f, src, qs, inv)
            dh = f.let(f"fpext half {f.let(f'fptrunc float {d} to half')} to float")
            f.store("float", dh, row, f.add(a.d_at, f.mul(j, 4)), 4)
            total = f.let(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {q})")
            f.store("i32", f.let(f"mul i32 {total}, -128"), row, f.add(a.c_at, f.mul(j, 4)), 4)
            return
        f.store("float", d, row, f.add(a.d_at, f.mul(j, 4)), 4)
        c16 = f.gep(row, f.add(a.c_at, f.mul(j, 64)))
        b32 = f.gep(row, f.add(a.b32_at, f.mul(j, 16)))
        for c in range(elems // 32):
            q = _quantize_chunk(f, f.gep(src, 128 * c), f.gep(qs, 32 * c), inv)
            sums = []
            for h in range(2):
                part = f.let(f"shufflevector <32 x i32> {q}, <32 x i32> poison, "
                             f"{_mask(list(range(16 * h, 16 * h + 16)))}")
                sums.append(f.let(f"call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> {part})"))
                f.store("i32", f.let(f"mul i32 {sums[-1]}, -32"), c16, 4 * (2 * c + h), 4)
            pair = f.let(f"add i32 {sums[0]}, {sums[1]}")
            f.store("i16", f.let(f"trunc i32 {pair} to i16"), b32, 2 * c, 2)

    def row(m: str) -> None:
        def block(j: str, _: list[str]) -> list[str]:
            per_block(m, j)
            return []

        f.loop("%nb", [], block)

    f.loop_range("%r0", "%r1", row)
    f.do("ret void")
    return f.text()


def build_gemm_ir(qtype: T, isa: str, tile: int | None = None) -> str:
    """The module for one weight type: its activation quantizer and its gemm function."""
    tile = TILES[qtype] if tile is None else tile
    if not supported(qtype, isa):
        raise ValueError(f"no interleaved kernel for {qtype.name} on {isa}")
    return DECLARATIONS + _build_quantize(ACTIVATION[qtype]) + _build_gemm(qtype, isa, tile)
