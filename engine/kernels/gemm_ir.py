"""The building blocks of the row-interleaved kernels (engine.kernels.gemm, gemm_quantize):
the intrinsic declarations, IR constants, Fn (loads and splats of 16-lane vectors), Dots (the
integer dot products on each instruction selection) and Act (addresses in an activation row).
"""
from __future__ import annotations

from collections.abc import Callable

from engine.formats.repack import ACT_BLOCK
from engine.kernels.irtext import IRFunction

ISAS = ("vnni512", "avx2", "portable")
V16F, V16I = "<16 x float>", "<16 x i32>"

DECLARATIONS = """
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)
declare <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32>, <16 x i32>, <16 x i32>)
declare <64 x i8> @llvm.x86.avx512.pshuf.b.512(<64 x i8>, <64 x i8>)
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


def vec(elem: str, values: list[int]) -> str:
    return "<" + ", ".join(f"{elem} {v}" for v in values) + ">"


def splat_bytes(values: list[int]) -> str:
    """A <n x i8> constant of these byte values (0..255 or -128..127)."""
    return vec("i8", [v - 256 if v > 127 else v for v in values])


def splat_i8(n: int, v: int) -> str:
    return splat_bytes([v] * n)


def vec_i32(v: int) -> str:
    return vec("i32", [v] * 16)


def mask(idx: list[int]) -> str:
    return f"<{len(idx)} x i32> " + vec("i32", idx)


class Fn(IRFunction):
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

    def shift_bytes(self, v: str, op: str, n: int, keep: int) -> str:
        """(v `op` n) & keep in each byte of a <64 x i8>, for op shl/lshr and a mask that
        drops the bits a 32-bit shift carries between bytes. x86 has no byte shift: LLVM
        lowers one to vgf2p8affineqb, an extra op on the vector pipes the dot products use
        (one thread, 5632x2048, M = 512: Q4_K 1.09x, Q6_K 1.07x with 32-bit shifts)."""
        w = self.let(f"bitcast <64 x i8> {v} to {V16I}")
        w = self.let(f"{op} {V16I} {w}, {vec_i32(n)}")
        w = self.let(f"bitcast {V16I} {w} to <64 x i8>")
        return self.let(f"and <64 x i8> {w}, {splat_i8(64, keep)}")

    def fma16(self, a: str, b: str, c: str) -> str:
        return self.let(f"call {V16F} @llvm.fma.v16f32({V16F} {a}, {V16F} {b}, {V16F} {c})")

    def tofloat(self, v: str) -> str:
        return self.let(f"sitofp {V16I} {v} to {V16F}")


class Dots:
    """dot(acc, u, s): acc + per lane the sum of four u8 x i8 products (u <64 x i8> weights,
    unsigned; s <16 x i32> activation bytes, signed). wdot(acc, a, b): acc + per lane the sum of
    two i16 x i16 products."""

    def __init__(self, f: Fn, isa: str) -> None:
        assert isa in ISAS
        self.f, self.isa = f, isa

    def _avx2_halves(self, acc: str, a: str, b: str, elem: str,
                     half: Callable[[str, str], str]) -> str:
        """acc + the two 256-bit halves' half(a_h, b_h) (<8 x i32> each), side by side."""
        f = self.f
        n = 64 if elem == "i8" else 32
        parts = []
        for h in range(2):
            m = mask(list(range(n // 2 * h, n // 2 * (h + 1))))
            ah, bh = (f.let(f"shufflevector <{n} x {elem}> {v}, <{n} x {elem}> poison, {m}") for v in (a, b))
            parts.append(half(ah, bh))
        both = f.let(f"shufflevector <8 x i32> {parts[0]}, <8 x i32> {parts[1]}, {mask(list(range(16)))}")
        return f.let(f"add {V16I} {acc}, {both}")

    def _sum_groups(self, v: str, n: int, k: int) -> str:
        """<n*k x i32> -> <n x i32>: sums of k consecutive lanes."""
        f = self.f
        parts = [f.let(f"shufflevector <{n * k} x i32> {v}, <{n * k} x i32> poison, "
                       f"{mask(list(range(j, n * k, k)))}") for j in range(k)]
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
            ones = vec("i16", [1] * 16)
            return self._avx2_halves(acc, u, s8, "i8", lambda uh, sh: f.let(
                f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> "
                f"{f.let(f'call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {uh}, <32 x i8> {sh})')}, "
                f"<16 x i16> {ones})"))
        uw = f.let(f"zext <64 x i8> {u} to <64 x i32>")
        sw = f.let(f"sext <64 x i8> {s8} to <64 x i32>")
        prod = f.let(f"mul <64 x i32> {uw}, {sw}")
        return f.let(f"add {V16I} {acc}, {self._sum_groups(prod, 16, 4)}")

    def lookup(self, idx: str, table: list[int]) -> str:
        """<64 x i8> indices 0..15 -> table[idx] (16 byte values): one vpshufb (the table in
        each 128-bit lane) on vnni512; portable: four rounds of selects on the index bits."""
        f = self.f
        if self.isa == "vnni512":
            return f.let(f"call <64 x i8> @llvm.x86.avx512.pshuf.b.512(<64 x i8> {splat_bytes(table * 4)}, "
                         f"<64 x i8> {idx})")
        assert self.isa == "portable", "AVX2 has no gemm form for a codebook type"
        values = [splat_i8(64, v) for v in table]
        for bit in range(4):
            mask_v = splat_i8(64, 1 << bit)
            on = f.let(f"icmp ne <64 x i8> {f.let(f'and <64 x i8> {idx}, {mask_v}')}, zeroinitializer")
            values = [f.let(f"select <64 x i1> {on}, <64 x i8> {hi}, <64 x i8> {lo}")
                      for lo, hi in zip(values[0::2], values[1::2])]
        return values[0]

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


class Act:
    """Addresses in an activation row (engine.formats.repack: qs | d | c (r8_0) or c16 | b32 (r8_k))."""

    def __init__(self, f: Fn, act: str) -> None:
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
