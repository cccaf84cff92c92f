"""KernelFn: IRFunction plus the vector loads, splats, conversions and sums both matmul families
(engine.kernels.matmul's 8-lane rows, engine.kernels.gemm's 16-row lanes) are written with."""
from __future__ import annotations

from collections.abc import Iterable

from engine.kernels.ir.consts import V16F, V16I, i32x16, shuffle_mask, splat_const, splat_i8, vec_const
from engine.kernels.ir.text import IRFunction


class KernelFn(IRFunction):
    """One kernel function's textual IR with the matmul kernels' vector helpers."""

    # --- loads and splats ----------------------------------------------------------------------
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

    def half16(self, base: str, offset: int) -> str:
        """16 halves at base + offset as a <16 x float>."""
        h = self.load("<16 x half>", base, offset, 2)
        return self.let(f"fpext <16 x half> {h} to {V16F}")

    def splat_i32(self, v: str) -> str:
        s = self.let(f"insertelement {V16I} poison, i32 {v}, i64 0")
        return self.let(f"shufflevector {V16I} {s}, {V16I} poison, <16 x i32> zeroinitializer")

    def bcast(self, base: str, offset: int | str) -> str:
        """The i32 at base + offset in every lane (x86: an embedded {1to16} broadcast)."""
        return self.splat_i32(self.load("i32", base, offset, 4))

    def widen16(self, base: str, offset: int | str, signed: bool) -> str:
        """16 bytes -> <16 x i32>, zero- or sign-extended."""
        v = self.load("<16 x i8>", base, offset)
        return self.let(f"{'sext' if signed else 'zext'} <16 x i8> {v} to {V16I}")

    # --- bit fields ----------------------------------------------------------------------------
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

    def shift_bytes(self, v: str, op: str, n: int, keep: int) -> str:
        """(v `op` n) & keep in each byte of a <64 x i8>, for op shl/lshr and a mask that
        drops the bits a 32-bit shift carries between bytes. x86 has no byte shift: LLVM
        lowers one to vgf2p8affineqb, an extra op on the vector pipes the dot products use
        (one thread, 5632x2048, M = 512: Q4_K 1.09x, Q6_K 1.07x with 32-bit shifts)."""
        w = self.let(f"bitcast <64 x i8> {v} to {V16I}")
        w = self.let(f"{op} {V16I} {w}, {i32x16(n)}")
        w = self.let(f"bitcast {V16I} {w} to <64 x i8>")
        return self.let(f"and <64 x i8> {w}, {splat_i8(64, keep)}")

    # --- float arithmetic ----------------------------------------------------------------------
    def fma(self, n: int, a: str, b: str, c: str) -> str:
        """a * b + c on <n x float> (llvm.fma: one rounding)."""
        ty = f"<{n} x float>"
        return self.let(f"call {ty} @llvm.fma.v{n}f32({ty} {a}, {ty} {b}, {ty} {c})")

    def tofloat(self, v: str) -> str:
        return self.let(f"sitofp {V16I} {v} to {V16F}")

    def hsum8(self, v: str) -> str:
        return self.let(f"call reassoc float @llvm.vector.reduce.fadd.v8f32(float -0.0, <8 x float> {v})")

    def hsum_halves(self, v: str) -> str:
        """Sum of 8 lanes as llama.cpp's hsum_float_8 adds them: (hi + lo), then halves again."""
        lo = self.let(f"shufflevector <8 x float> {v}, <8 x float> poison, {shuffle_mask(range(4))}")
        hi = self.let(f"shufflevector <8 x float> {v}, <8 x float> poison, {shuffle_mask(range(4, 8))}")
        r = self.let(f"fadd <4 x float> {hi}, {lo}")
        r = self.let(f"fadd <4 x float> {r}, {self.let(f'shufflevector <4 x float> {r}, <4 x float> poison, {shuffle_mask([2, 3, 2, 3])}')}")
        a = self.let(f"extractelement <4 x float> {r}, i64 0")
        return self.let(f"fadd float {a}, {self.let(f'extractelement <4 x float> {r}, i64 1')}")
