"""The integer dot products per instruction selection, for both matmul families.

    IntOps  (engine.kernels.matmul: a row's values along the lanes, <8 x i32> sums)
            AVX2: `llvm.x86.avx2.pmadd.ub.sw` (u8 x s8 -> pairwise i16 sums) and
            `llvm.x86.avx2.pmadd.wd` (i16 x i16 -> pairwise i32 sums), which LLVM does not form
            from plain IR; with VNNI (AVX-512 VL or AVX-VNNI) u8 x s8 sums of four take one
            `vpdpbusd`; portable: the same sums in generic vector IR.
    Dots    (engine.kernels.gemm: one weight row per lane of <16 x i32>)
            vnni512: `vpdpbusd` / `vpdpwssd` on 512-bit vectors; avx2: IntOps' AVX2 sums on
            each 256-bit half; portable: generic vector IR.

Every selection gives the same integers (same lane grouping, sums kept small enough that the
AVX2 forms never saturate), so every ISA entry gives the same bits as its portable twin.
"""
from __future__ import annotations

from collections.abc import Callable

from engine.kernels.ir.consts import V16I, bytes_const, shuffle_mask, splat_const, splat_i8, vec_const
from engine.kernels.ir.text import IRFunction

ISAS = ("vnni512", "avx2", "portable")  # Dots' instruction selections


# --- shared emitters ----------------------------------------------------------------------------

def sum_groups(f: IRFunction, v: str, n: int, k: int, elem: str = "i32") -> str:
    """<n*k x elem> -> <n x elem>: sums of k consecutive lanes."""
    parts = [f.let(f"shufflevector <{n * k} x {elem}> {v}, <{n * k} x {elem}> poison, "
                   f"{shuffle_mask(range(j, n * k, k))}") for j in range(k)]
    total = parts[0]
    for p in parts[1:]:
        total = f.let(f"add <{n} x {elem}> {total}, {p}")
    return total


def products(f: IRFunction, a: str, b: str, n: int, narrow: str, wide: str, extend_a: str) -> str:
    """a * b lane by lane, both widened from <n x narrow> to <n x wide> (a by extend_a, b signed)."""
    aw = f.let(f"{extend_a} <{n} x {narrow}> {a} to <{n} x {wide}>")
    bw = f.let(f"sext <{n} x {narrow}> {b} to <{n} x {wide}>")
    return f.let(f"mul <{n} x {wide}> {aw}, {bw}")


def vpdpbusd(f: IRFunction, acc: str, u: str, s: str, lanes: int) -> str:
    """acc + sums of four u8 x s8 products per i32 lane (u, s already <lanes x i32>)."""
    ty = f"<{lanes} x i32>"
    return f.let(f"call {ty} @llvm.x86.avx512.vpdpbusd.{32 * lanes}({ty} {acc}, {ty} {u}, {ty} {s})")


def vpdpwssd(f: IRFunction, acc: str, a: str, b: str, lanes: int) -> str:
    """acc + sums of two i16 x i16 products per i32 lane (a, b already <lanes x i32>)."""
    ty = f"<{lanes} x i32>"
    return f.let(f"call {ty} @llvm.x86.avx512.vpdpwssd.{32 * lanes}({ty} {acc}, {ty} {a}, {ty} {b})")


# --- the row-wise family's: <32 x i8> operands, <8 x i32> sums ---------------------------------

class IntOps:
    """The integer dot-product primitives, in AVX2 intrinsics or in portable IR.

    maddubs(u, s): <32 x i8> unsigned x <32 x i8> signed -> <16 x i16>, lane k = u[2k]s[2k] + u[2k+1]s[2k+1]
    madd(a, b):    <16 x i16> x <16 x i16> -> <8 x i32>,  lane k = a[2k]b[2k] + a[2k+1]b[2k+1]
    Callers keep every sum small enough that the AVX2 form never saturates, so both agree.
    """

    def __init__(self, f: IRFunction, avx2: bool, vnni: bool = False) -> None:
        self.f = f
        self.avx2 = avx2
        self.vnni = vnni and avx2

    def _pairs(self, v: str, n: int, elem: str) -> str:
        """<2n x elem> -> <n x elem>: sum of adjacent pairs."""
        return sum_groups(self.f, v, n, 2, elem)

    def _pair_products(self, intrinsic: str, a: str, b: str, n: int, narrow: str, wide: str,
                       extend_a: str) -> str:
        """Adjacent pairs of a * b widened (n lanes in, n/2 out): one AVX2 instruction, or the
        same sums written out for the portable path."""
        f = self.f
        if self.avx2:
            return f.let(f"call <{n // 2} x {wide}> @{intrinsic}(<{n} x {narrow}> {a}, <{n} x {narrow}> {b})")
        return self._pairs(products(f, a, b, n, narrow, wide, extend_a), n // 2, wide)

    def maddubs(self, u: str, s: str) -> str:
        """Unsigned bytes u times signed bytes s, adjacent pairs added: <16 x i16>."""
        return self._pair_products("llvm.x86.avx2.pmadd.ub.sw", u, s, 32, "i8", "i16", "zext")

    def madd(self, a: str, b: str) -> str:
        """Signed i16 products, adjacent pairs added: <8 x i32>."""
        return self._pair_products("llvm.x86.avx2.pmadd.wd", a, b, 16, "i16", "i32", "sext")

    def madd_acc(self, acc: str, a: str, b: str) -> str:
        """acc + madd(a, b) (<8 x i32>). With VNNI one vpdpwssd, called as the intrinsic so
        that each accumulator stays its own chain: LLVM otherwise folds every madd + add of
        a block into one chain of dependent vpdpwssd (the integers are the same either way)."""
        if not self.vnni:
            return self.f.let(f"add <8 x i32> {acc}, {self.madd(a, b)}")
        f = self.f
        a32 = f.let(f"bitcast <16 x i16> {a} to <8 x i32>")
        b32 = f.let(f"bitcast <16 x i16> {b} to <8 x i32>")
        return vpdpwssd(f, acc, a32, b32, 8)

    def dot_us(self, u: str, s: str) -> str:
        """<8 x i32>, lane k = sum of u[j]*s[j] for j in 4k..4k+3 (u unsigned).

        With VNNI one vpdpbusd does it (the same exact integer sums as maddubs + madd, which
        never saturate here).
        """
        if self.vnni:
            return self._vpdpbusd(u, s, 8)
        return self.madd(self.maddubs(u, s), splat_const("i16", 16, 1))

    def dot_us_wide(self, u: str, s: str) -> str:
        """dot_us on <64 x i8> (two rows' blocks side by side) -> <16 x i32> (AVX-512 VNNI)."""
        return self._vpdpbusd(u, s, 16)

    def _vpdpbusd(self, u: str, s: str, lanes: int) -> str:
        """<4 * lanes x i8> u (unsigned) and s (signed) -> <lanes x i32>: sums of four products."""
        f, ty = self.f, f"<{lanes} x i32>"
        u32 = f.let(f"bitcast <{4 * lanes} x i8> {u} to {ty}")
        s32 = f.let(f"bitcast <{4 * lanes} x i8> {s} to {ty}")
        return vpdpbusd(f, "zeroinitializer", u32, s32, lanes)

    def signed_wide(self, a: str) -> tuple[str, str]:
        """Signed weights `a` (<32 x i8>) for dot_ss_wide: (|a| twice, a < 0 twice)."""
        f = self.f
        a2 = f.let(f"shufflevector <32 x i8> {a}, <32 x i8> poison, {shuffle_mask(list(range(32)) * 2)}")
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

    def dot_ss_pairs(self, prepared: tuple[str, str], s: str) -> str:
        """<16 x i16>, lane k = a[2k]s[2k] + a[2k+1]s[2k+1] (both signed, within +-127, so the
        AVX2 form's |a| x sign(a)s never saturates): for sums scaled per group of 16 by madd."""
        f = self.f
        mag, a = prepared
        if self.avx2:
            return self.maddubs(mag, f.let(f"call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> {s}, <32 x i8> {a})"))
        return self._pairs(products(f, a, s, 32, "i8", "i16", "sext"), 16, "i16")

    def lookup(self, idx: str, table: tuple[int, ...]) -> str:
        """<32 x i8> indices 0..15 -> <32 x i8> table[idx] (a 16-entry signed codebook): one
        vpshufb on AVX2 (the table in both 128-bit lanes), one lane at a time in portable IR."""
        f = self.f
        if self.avx2:
            both = vec_const("i8", [*table, *table])
            return f.let(f"call <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8> {both}, <32 x i8> {idx})")
        codes, v = vec_const("i8", table), "poison"
        for k in range(32):
            i = f.let(f"extractelement <32 x i8> {idx}, i64 {k}")
            code = f.let(f"extractelement <16 x i8> {codes}, i8 {i}")
            v = f.let(f"insertelement <32 x i8> {v}, i8 {code}, i64 {k}")
        return v

    def dot_ss(self, prepared: tuple[str, str], s: str) -> str:
        """<8 x i32>, lane k = sum of a[j]*s[j] for j in 4k..4k+3 (both signed)."""
        f = self.f
        mag, a = prepared
        if self.avx2:
            signed_s = f.let(f"call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> {s}, <32 x i8> {a})")
            return self.dot_us(mag, signed_s)
        prod = products(f, a, s, 32, "i8", "i32", "sext")
        return self._pairs(self._pairs(prod, 16, "i32"), 8, "i32")


# --- the interleaved family's: <64 x i8> weights of 16 rows, one row per <16 x i32> lane --------

class Dots:
    """dot(acc, u, s): acc + per lane the sum of four u8 x i8 products (u <64 x i8> weights,
    unsigned; s <16 x i32> activation bytes, signed). wdot(acc, a, b): acc + per lane the sum of
    two i16 x i16 products."""

    def __init__(self, f: IRFunction, isa: str) -> None:
        assert isa in ISAS
        self.f, self.isa = f, isa
        self._halves = IntOps(f, avx2=True)  # the AVX2 form, on each 256-bit half

    def _avx2_halves(self, acc: str, a: str, b: str, elem: str,
                     half: Callable[[str, str], str]) -> str:
        """acc + the two 256-bit halves' half(a_h, b_h) (<8 x i32> each), side by side."""
        f = self.f
        n = 64 if elem == "i8" else 32
        parts = []
        for h in range(2):
            m = shuffle_mask(range(n // 2 * h, n // 2 * (h + 1)))
            ah, bh = (f.let(f"shufflevector <{n} x {elem}> {v}, <{n} x {elem}> poison, {m}") for v in (a, b))
            parts.append(half(ah, bh))
        both = f.let(f"shufflevector <8 x i32> {parts[0]}, <8 x i32> {parts[1]}, {shuffle_mask(range(16))}")
        return f.let(f"add {V16I} {acc}, {both}")

    def dot(self, acc: str, u: str, s: str) -> str:
        f = self.f
        if self.isa == "vnni512":
            return vpdpbusd(f, acc, f.let(f"bitcast <64 x i8> {u} to {V16I}"), s, 16)
        s8 = f.let(f"bitcast {V16I} {s} to <64 x i8>")
        if self.isa == "avx2":
            return self._avx2_halves(acc, u, s8, "i8", self._halves.dot_us)
        prod = products(f, u, s8, 64, "i8", "i32", "zext")
        return f.let(f"add {V16I} {acc}, {sum_groups(f, prod, 16, 4)}")

    def lookup(self, idx: str, table: list[int]) -> str:
        """<64 x i8> indices 0..15 -> table[idx] (16 byte values): one vpshufb (the table in
        each 128-bit lane) on vnni512; portable: four rounds of selects on the index bits."""
        f = self.f
        if self.isa == "vnni512":
            return f.let(f"call <64 x i8> @llvm.x86.avx512.pshuf.b.512(<64 x i8> {bytes_const(table * 4)}, "
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
            return vpdpwssd(f, acc, a, b, 16)
        a16 = f.let(f"bitcast {V16I} {a} to <32 x i16>")
        b16 = f.let(f"bitcast {V16I} {b} to <32 x i16>")
        if self.isa == "avx2":
            return self._avx2_halves(acc, a16, b16, "i16", self._halves.madd)
        prod = products(f, a16, b16, 32, "i16", "i32", "sext")
        return f.let(f"add {V16I} {acc}, {sum_groups(f, prod, 16, 2)}")
