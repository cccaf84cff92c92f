"""The instruction-level helpers every matmul kernel is written with: textual IR constants, the
weight-block loads of MatmulFn, the intrinsic declarations, and IntOps, the integer dot products.

Three instruction selections: the AVX2 one calls `llvm.x86.avx2.pmadd.ub.sw` (u8 x s8 -> pairwise
i16 sums) and `llvm.x86.avx2.pmadd.wd` (i16 x i16 -> pairwise i32 sums), which LLVM does not form
from plain IR; on hosts with VNNI, u8 x s8 sums of four take one `vpdpbusd` instead (the same
integers); the portable one spells the same sums in generic vector IR (same lane grouping,
so both give the same integers).
"""
from __future__ import annotations

from collections.abc import Iterable

from engine.kernels.irtext import IRFunction

# --- textual IR helpers -----------------------------------------------------------------------

def vec_const(elem: str, values: Iterable[int | float | str]) -> str:
    """A constant vector: <i8 1, i8 2, ...>."""
    return "<" + ", ".join(f"{elem} {v}" for v in values) + ">"


def splat_const(elem: str, n: int, value: int | float | str) -> str:
    return vec_const(elem, [value] * n)


def shuffle_mask(indices: Iterable[int]) -> str:
    """A typed shufflevector mask: <n x i32> <i32 a, ...>."""
    idx = list(indices)
    return f"<{len(idx)} x i32> " + vec_const("i32", idx)


def i8_const(v: int) -> int:
    """An unsigned byte constant as the signed i8 literal LLVM expects."""
    return v - 256 if v > 127 else v


class MatmulFn(IRFunction):
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
        both = self.let(f"shufflevector <16 x i8> {qs}, <16 x i8> poison, {shuffle_mask(list(range(16)) * 2)}")
        wide = self.let(f"bitcast <32 x i8> {both} to <4 x i64>")
        wide = self.let(f"lshr <4 x i64> {wide}, <i64 0, i64 0, i64 4, i64 4>")
        both = self.let(f"bitcast <4 x i64> {wide} to <32 x i8>")
        return self.let(f"and <32 x i8> {both}, {splat_const('i8', 32, 15)}")

    def field(self, v: str, n: int, elem: str, shift: int | Iterable[int], mask: int) -> str:
        """(v >> shift) & mask per lane of <n x elem>; shift is one count or one per lane."""
        ty = f"<{n} x {elem}>"
        by = splat_const(elem, n, shift) if isinstance(shift, int) else vec_const(elem, shift)
        return self.let(f"and {ty} {self.let(f'lshr {ty} {v}, {by}')}, {splat_const(elem, n, mask)}")

    def nibble_halves(self, v: str, n: int) -> tuple[str, str]:
        """<n x i8> -> (low nibbles, high nibbles), each 0..15."""
        return (self.let(f"and <{n} x i8> {v}, {splat_const('i8', n, 15)}"),
                self.let(f"lshr <{n} x i8> {v}, {splat_const('i8', n, 4)}"))

    def bits32(self, word: str, value: int) -> str:
        """i32 -> <32 x i8>: `value` where bit j is set, else 0."""
        bits = self.let(f"bitcast i32 {word} to <32 x i1>")
        return self.let(f"select <32 x i1> {bits}, <32 x i8> {splat_const('i8', 32, value)}, "
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
declare i32 @llvm.vector.reduce.add.v8i32(<8 x i32>)
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)
declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)
declare <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)
declare <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8>, <32 x i8>)
declare <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>, <8 x i32>, <8 x i32>)
declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)
declare <8 x i32> @llvm.x86.avx512.vpdpwssd.256(<8 x i32>, <8 x i32>, <8 x i32>)
declare <64 x i8> @llvm.abs.v64i8(<64 x i8>, i1)
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
"""


class IntOps:
    """The integer dot-product primitives, in AVX2 intrinsics or in portable IR.

    maddubs(u, s): <32 x i8> unsigned x <32 x i8> signed -> <16 x i16>, lane k = u[2k]s[2k] + u[2k+1]s[2k+1]
    madd(a, b):    <16 x i16> x <16 x i16> -> <8 x i32>,  lane k = a[2k]b[2k] + a[2k+1]b[2k+1]
    Callers keep every sum small enough that the AVX2 form never saturates, so both agree.
    """

    def __init__(self, f: MatmulFn, avx2: bool, vnni: bool = False) -> None:
        self.f = f
        self.avx2 = avx2
        self.vnni = vnni and avx2

    def _pairs(self, v: str, n: int, elem: str) -> str:
        """<2n x elem> -> <n x elem>: sum of adjacent pairs."""
        f = self.f
        ev = f.let(f"shufflevector <{2 * n} x {elem}> {v}, <{2 * n} x {elem}> poison, {shuffle_mask(range(0, 2 * n, 2))}")
        od = f.let(f"shufflevector <{2 * n} x {elem}> {v}, <{2 * n} x {elem}> poison, {shuffle_mask(range(1, 2 * n, 2))}")
        return f.let(f"add <{n} x {elem}> {ev}, {od}")

    def _pair_products(self, intrinsic: str, a: str, b: str, n: int, narrow: str, wide: str,
                       extend_a: str) -> str:
        """Adjacent pairs of a * b widened (n lanes in, n/2 out): one AVX2 instruction, or the
        same sums written out for the portable path."""
        f = self.f
        if self.avx2:
            return f.let(f"call <{n // 2} x {wide}> @{intrinsic}(<{n} x {narrow}> {a}, <{n} x {narrow}> {b})")
        aw = f.let(f"{extend_a} <{n} x {narrow}> {a} to <{n} x {wide}>")
        bw = f.let(f"sext <{n} x {narrow}> {b} to <{n} x {wide}>")
        return self._pairs(f.let(f"mul <{n} x {wide}> {aw}, {bw}"), n // 2, wide)

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
        return f.let(f"call <8 x i32> @llvm.x86.avx512.vpdpwssd.256(<8 x i32> {acc}, <8 x i32> {a32}, "
                     f"<8 x i32> {b32})")

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
        return f.let(f"call {ty} @llvm.x86.avx512.vpdpbusd.{32 * lanes}({ty} zeroinitializer, "
                     f"{ty} {u32}, {ty} {s32})")

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
        aw = f.let(f"sext <32 x i8> {a} to <32 x i16>")
        sw = f.let(f"sext <32 x i8> {s} to <32 x i16>")
        return self._pairs(f.let(f"mul <32 x i16> {aw}, {sw}"), 16, "i16")

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
        aw = f.let(f"sext <32 x i8> {a} to <32 x i32>")
        sw = f.let(f"sext <32 x i8> {s} to <32 x i32>")
        return self._pairs(self._pairs(f.let(f"mul <32 x i32> {aw}, {sw}"), 16, "i32"), 8, "i32")


V8F = "<8 x float>"


def fma_vec(f: MatmulFn, n: int, a: str, b: str, c: str) -> str:
    ty = f"<{n} x float>"
    return f.let(f"call {ty} @llvm.fma.v{n}f32({ty} {a}, {ty} {b}, {ty} {c})")



def hsum_halves(f: MatmulFn, v: str) -> str:
    """Sum of 8 lanes as llama.cpp's hsum_float_8 adds them: (hi + lo), then halves again."""
    lo = f.let(f"shufflevector <8 x float> {v}, <8 x float> poison, {shuffle_mask(range(4))}")
    hi = f.let(f"shufflevector <8 x float> {v}, <8 x float> poison, {shuffle_mask(range(4, 8))}")
    r = f.let(f"fadd <4 x float> {hi}, {lo}")
    r = f.let(f"fadd <4 x float> {r}, {f.let(f'shufflevector <4 x float> {r}, <4 x float> poison, {shuffle_mask([2, 3, 2, 3])}')}")
    a = f.let(f"extractelement <4 x float> {r}, i64 0")
    return f.let(f"fadd float {a}, {f.let(f'extractelement <4 x float> {r}, i64 1')}")

