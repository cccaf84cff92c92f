"""The interleaved family's bodies for the 32-value block types (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1,
Q5_1): one block of 16 weight rows unpacked to <64 x i8> chunks (one row per 32-bit lane) and
integer-dotted with each tile row's broadcast activation bytes (engine.formats.repack has the
layouts and the arithmetic, gemm.build the loop nest that calls them)."""
from __future__ import annotations

from collections.abc import Sequence

from engine.formats.quant_iq import CODEBOOK
from engine.kernels.gemm.quantizer import Act
from engine.kernels.ir.consts import V16F, V16I, i32x16, splat_i8
from engine.kernels.ir.intdot import Dots
from engine.kernels.ir.vectors import KernelFn


def body_q8_0(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    isums = [f.bcast(x, f.add(act.c_at, f.mul(b, 4))) for x in xs]   # -128 * sum(y)
    qs = f.mul(b, 32)
    for k in range(8):
        u = f.load("<64 x i8>", wb, 64 * k)
        isums = [dots.dot(acc, u, f.bcast(x, f.add(qs, 4 * k))) for acc, x in zip(isums, xs)]
    dw = f.half16(wb, 512)
    out = []
    for acc, isum, x in zip(accs, isums, xs):
        dx = f.splat_float(f.load("float", x, f.add(act.d_at, f.mul(b, 4)), 4), 16)
        out.append([f.fma(16, f.let(f"fmul {V16F} {dw}, {dx}"), f.tofloat(isum), acc[0])])
    return out


def body_iq4_nl(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
                 accs: Sequence[Sequence[str]]) -> list[list[str]]:
    """As Q8_0, with q + 128 = (CODEBOOK + 128)[nibble] (one vpshufb per chunk)."""
    table = [v + 128 for v in CODEBOOK]
    chunks = [dots.lookup(c, table) for c in legacy_chunks(f, wb, None)]
    isums = [f.bcast(x, f.add(act.c_at, f.mul(b, 4))) for x in xs]   # -128 * sum(y)
    qs = f.mul(b, 32)
    for k in range(8):
        isums = [dots.dot(acc, chunks[k], f.bcast(x, f.add(qs, 4 * k))) for acc, x in zip(isums, xs)]
    dw = f.half16(wb, 256)
    return [[f.fma(16, x_scale(f, act, x, b, dw), f.tofloat(isum), acc[0])]
            for acc, isum, x in zip(accs, isums, xs)]


def _q5_top_bits(f: KernelFn, qh: str, first: int) -> str:
    """Bits first..first+3 of each lane's qh, as bit 4 of its four bytes (a multiply spreads
    4 bits to bytes 0..3: x * 0x204081 is x | x << 7 | x << 14 | x << 21, no carries)."""
    t = f.let(f"and {V16I} {f.let(f'lshr {V16I} {qh}, {i32x16(first)}') if first else qh}, {i32x16(15)}")
    t = f.let(f"mul {V16I} {t}, {i32x16(0x204081 << 4)}")
    return f.let(f"bitcast {V16I} {f.let(f'and {V16I} {t}, {i32x16(0x10101010)}')} to <64 x i8>")


def body_q4_0(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_offset(f, dots, act, wb, b, xs, accs, None, 4)


def body_q5_0(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_offset(f, dots, act, wb, b, xs, accs, 256, 3)


def _body_offset(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
                 accs: Sequence[Sequence[str]], qh_at: int | None, shift: int) -> list[list[str]]:
    """Q4_0/Q5_0: as Q8_0 with q = nibble (| 5th bit << 4 with qh: unsigned, 0..15 or 0..31)
    and the offset -8 or -16 * sum(y) (the r8_0 row's c >> 4 or >> 3, exact) as the starting
    value."""
    chunks = legacy_chunks(f, wb, qh_at)
    qs = f.mul(b, 32)
    dw = f.half16(wb, 256 + (64 if qh_at is not None else 0))
    out = []
    for acc, x in zip(accs, xs):
        c = f.let(f"ashr {V16I} {f.bcast(x, f.add(act.c_at, f.mul(b, 4)))}, {i32x16(shift)}")
        for k in range(8):
            c = dots.dot(c, chunks[k], f.bcast(x, f.add(qs, 4 * k)))
        out.append([f.fma(16, x_scale(f, act, x, b, dw), f.tofloat(c), acc[0])])
    return out


def legacy_chunks(f: KernelFn, wb: str, qh_at: int | None, at: int = 0) -> list[str]:
    """The legacy types' 8 chunks of unsigned values (nibble, | 5th bit << 4 with qh), from the
    4 x 64 bytes of nibbles at wb + at."""
    qh = f.load(V16I, wb, qh_at) if qh_at is not None else None
    chunks: list[str] = [""] * 8
    for k in range(4):
        v = f.load("<64 x i8>", wb, at + 64 * k)
        lo = f.let(f"and <64 x i8> {v}, {splat_i8(64, 15)}")
        hi = f.shift_bytes(v, "lshr", 4, 15)
        if qh is not None:
            lo = f.let(f"or <64 x i8> {lo}, {_q5_top_bits(f, qh, 4 * k)}")
            hi = f.let(f"or <64 x i8> {hi}, {_q5_top_bits(f, qh, 16 + 4 * k)}")
        chunks[k], chunks[k + 4] = lo, hi
    return chunks


def _body_q4_5_1(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
                 accs: Sequence[Sequence[str]], qh_at: int | None) -> list[list[str]]:
    """Q4_1/Q5_1 (d * q + m) against r8_1: acc = fma(d * dx, float(sum q * y), acc), then
    fma(m, s, acc) with s = dx * sum(y) (ggml's q8_1 s)."""
    chunks = legacy_chunks(f, wb, qh_at)
    at = 256 + (64 if qh_at is not None else 0)
    dw, mw = f.half16(wb, at), f.half16(wb, at + 32)
    qs = f.mul(b, 32)
    out = []
    for acc, x in zip(accs, xs):
        isum = "zeroinitializer"
        for k in range(8):
            isum = dots.dot(isum, chunks[k], f.bcast(x, f.add(qs, 4 * k)))
        acc0 = f.fma(16, x_scale(f, act, x, b, dw), f.tofloat(isum), acc[0])
        sx = f.splat_float(f.load("float", x, f.add(act.c_at, f.mul(b, 4)), 4), 16)
        out.append([f.fma(16, mw, sx, acc0)])
    return out


def body_q4_1(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q4_5_1(f, dots, act, wb, b, xs, accs, None)


def body_q5_1(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q4_5_1(f, dots, act, wb, b, xs, accs, 256)


def x_scale(f: KernelFn, act: Act, x: str, b: str, w_scale: str) -> str:
    """w_scale * dx[b] for one activation row (16 weight rows' products)."""
    dx = f.splat_float(f.load("float", x, f.add(act.d_at, f.mul(b, 4)), 4), 16)
    return f.let(f"fmul {V16F} {w_scale}, {dx}")
