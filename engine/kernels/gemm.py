"""Row-interleaved quantized matmul kernels (decode and prefill): LLVM IR builders.

    out[m, r] = dot(W[r, :], x[m, :])   W: engine.formats.repack.RepackedMatrix [N, K]   x: [M, K]

engine/formats/repack.py has the layouts and the arithmetic; gemm_ir.py the building blocks (KernelFn, Dots,
Act), gemm_quantize.py the activation quantizers. Per weight type the module holds
    quantize_<act>(x, xq, nb, r0, r1, M)          rows [r0, r1) of f32 [M, K] -> act rows
    gemm_<type>(w, xq, out, nb, r0, r1, M, N)     weight rows [r0, r1) against all M rows
the same signatures as engine.kernels.matmul's quantize_/rows_ functions, so the task graph
runs either. A thread's rows are rounded up to whole groups of 16 ([ceil16(r0), ceil16(r1)):
consecutive ranges stay disjoint and cover [0, N)), so callers split anywhere.

The loop nest: for each group of 16 weight rows, for each tile of TILES[type] activation rows
(then one smaller tile and single rows), for each block: unpack the 16 rows' block
(registers), then for each tile row take the integer dot products with 4-byte activation
broadcasts (`vpdpbusd` adds four u8 x i8 products into each row's lane), scale and accumulate
per block. A tile's accumulators live in registers; the group's weights stay in L1/L2 while
all M activation rows stream past them, so weights are read from memory once per call. Calls
of one row (decode) go to the nest compiled for single rows alone (gemm_<type>_one). The
K-quants and IQ4_XS sum a whole super-block in integers and keep 2 accumulators per activation
row (Q2_K, Q4_K and Q5_K: the block's and its mins') or 1; for Q4_K, Q5_K and Q6_K those are the
file-layout kernel's float operations in its order (FILE_LAYOUT_BITS). Their bodies read a
block's quants in memory order, which the hardware prefetchers follow.

Instruction selections (the same integers everywhere, so all give the same bits):
  vnni512   `vpdpbusd` / `vpdpwssd` on 512-bit vectors (AVX-512 VNNI + BW)
  avx2      `vpmaddubsw` + `vpmaddwd` per 256-bit half: exact because every u8 weight operand
            of the AVX2 path is < 64 (maddubs never saturates); Q8_0's u8 weights reach 255,
            so Q8_0 has no AVX2 form here (the file-layout kernels serve it)
  portable  the same sums in generic vector IR
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from engine.formats.quant_iq import CODEBOOK
from engine.formats.repack import ACTIVATION, GROUP_BLOCK_BYTES, ROWS, T
from engine.kernels.gemm_quantize import Act, build_quantize
from engine.kernels.ir.consts import V16F, V16I, i32x16, splat_i8
from engine.kernels.ir.intdot import Dots
from engine.kernels.ir.intrinsics import declarations
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.jit import NO_MACHINE_SCHEDULER

# activation rows per tile: a tile row keeps LANES[type] accumulators of 16 rows
TILES = dict.fromkeys([T.Q8_0, T.Q4_0, T.Q5_0, T.IQ4_NL, T.Q4_1, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
                       T.Q6_K, T.IQ4_XS], 4)
# The K-quants fold each step's sub-block chains into the isum as they complete, so a tile row
# holds 2 dot chains, and the module compiles without LLVM's machine scheduler (jit's
# NO_MACHINE_SCHEDULER), which hoisted a block's unpacked quants into stack slots: 4-row tiles
# ran at 0.6-0.85x of 1 row with it. Without it, one thread, 1.1B shapes, M = 8 and 512: tiles as
# before (Q4_K 2, Q5_K/Q6_K 3) 0.96-1.05x, Q5_K 1.26-1.30x (a scratch A/B of the two builds);
# 4 rows / those Q4_K 1.13-1.20x and 0.99-1.06x, Q6_K 1.06-1.12x and 1.06-1.12x, Q5_K
# 1.05-1.09x and 1.06-1.10x; 6 rows / 4 0.59-0.96x for Q4_K, Q8_0 and Q5_0
# (scripts/bench_matmul.py --ab-tiles A,B --types T --shapes 1b --ms 8,512).
# A call's rows: whole tiles, then one smaller tile for what is left, then single rows.
# (no software prefetch for single rows: 1-8 blocks ahead, to L1 or L2, measured 10-35% slower
# from DRAM; for the K-quants read in memory order, 32 blocks ahead was slower (Q4_K M = 1:
# 27.5 -> 19.3 GB/s). Tiles prefetch the next group: see _build_gemm.)

# Single rows of these types prefetch this many bytes ahead into L2, a block's lines per block:
# the low-bit K-quants spend so many instructions per byte that the out-of-order window covers
# too little of the stream (one thread, M = 1, 1.1B shapes from DRAM, against no prefetch: Q2_K
# 4 KiB 1.28-1.44x the file layout, 8 KiB 1.68-1.87x, 16 KiB 1.56-1.73x, from 0.69-0.87x; Q3_K
# 8 KiB 1.28-1.59x from 0.64-0.67x; to L1 instead: 0.74-1.12x).
ONE_ROW_PREFETCH = {T.Q2_K: 8192, T.Q3_K: 8192}

# A body folds one block of 16 weight rows into each tile row's accumulators: accs[t] holds
# LANES[type] <16 x float> vectors (see the module docstring), returned updated.
_Body = Callable[[KernelFn, Dots, Act, str, str, list[str], Sequence[Sequence[str]]], list[list[str]]]

def _body_q8_0(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
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


def _body_iq4_nl(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
                 accs: Sequence[Sequence[str]]) -> list[list[str]]:
    """As Q8_0, with q + 128 = (CODEBOOK + 128)[nibble] (one vpshufb per chunk)."""
    table = [v + 128 for v in CODEBOOK]
    chunks = [dots.lookup(c, table) for c in _legacy_chunks(f, wb, None)]
    isums = [f.bcast(x, f.add(act.c_at, f.mul(b, 4))) for x in xs]   # -128 * sum(y)
    qs = f.mul(b, 32)
    for k in range(8):
        isums = [dots.dot(acc, chunks[k], f.bcast(x, f.add(qs, 4 * k))) for acc, x in zip(isums, xs)]
    dw = f.half16(wb, 256)
    return [[f.fma(16, _x_scale(f, act, x, b, dw), f.tofloat(isum), acc[0])]
            for acc, isum, x in zip(accs, isums, xs)]


def _body_iq4_xs(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
                 accs: Sequence[Sequence[str]]) -> list[list[str]]:
    """Whole-block arithmetic, as Q6_K's: per row an exact int32 isum = sum_j sc_j * dot_j over
    the 8 sub-blocks, each an IQ4_NL block (codebook + 128 by vpshufb) whose chain of 8 vpdpbusd
    starts from -128 * sum(y_j) = 4 * (c16_2j + c16_2j+1); then acc = fma(float(isum), d * dx,
    acc). (The file layout folds the isum's 8 lanes as llama.cpp does: folded whole there, as
    the K-quants are, it ran 1.1-1.3x slower, so the two round differently.)"""
    table = [v + 128 for v in CODEBOOK]
    qs = f.mul(b, 256)
    c16 = f.add(act.c_at, f.mul(b, 64))
    dw = f.half16(wb, 0)
    isums = [""] * len(xs)
    for j in range(8):
        chunks = [dots.lookup(c, table) for c in _legacy_chunks(f, wb, None, at=160 + 256 * j)]
        sc = f.widen16(wb, 32 + 16 * j, signed=True)
        for t, x in enumerate(xs):
            halves = [f.load("i32", x, f.add(c16, 8 * j + 4 * h), 4) for h in range(2)]
            dot = f.splat_i32(f.let(f"shl i32 {f.let(f'add i32 {halves[0]}, {halves[1]}')}, 2"))
            for k in range(8):
                dot = dots.dot(dot, chunks[k], f.bcast(x, f.add(qs, 32 * j + 4 * k)))
            term = f.let(f"mul {V16I} {dot}, {sc}")
            isums[t] = f.let(f"add {V16I} {isums[t]}, {term}") if isums[t] else term
    return [[f.fma(16, f.tofloat(isums[t]), _x_scale(f, act, x, b, dw), accs[t][0])]
            for t, x in enumerate(xs)]


def _body_q2_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q2_3_k(f, dots, act, wb, b, xs, accs, q3=False)


def _body_q3_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q2_3_k(f, dots, act, wb, b, xs, accs, q3=True)


def _body_q2_3_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
                 accs: Sequence[Sequence[str]], q3: bool) -> list[list[str]]:
    """Q2_K / Q3_K, whole-block arithmetic as Q4_K's over 16 sub-blocks of 16 values:
    isum = sum_g sc_g * dot_g, each dot_g a chain of 4 vpdpbusd over the 2-bit values (| the
    hmask bit << 2 for Q3_K, which starts the chain from -4 * bsum_g = c16_g >> 3: its values
    are q - 4); Q2_K's mins: msum = sum_g mn_g * c16_g = -32 * sum_g mn_g * bsum_g. Then
    acc = fma(float(isum), d * dx, acc) and (Q2_K) nacc = fma(float(msum), dmin * dx / 32,
    nacc). Sub-block g = 8h + 2j + s holds bits 2j.. of the qs chunks 4s..4s+3 of half h."""
    sc_at, qs_at = (32, 800) if q3 else (64, 576)
    qs_x = f.mul(b, 256)
    c16 = f.add(act.c_at, f.mul(b, 64))
    # the block's head first, in memory order: its scales as whole vectors of raw bytes, each
    # sub-block's 16 widened where it is used (against 16 bytes loaded there, M = 1: Q2_K
    # 1.68-1.87x the file layout against 1.43-1.63x, Q3_K 1.28-1.59x against 1.20-1.33x,
    # bench_matmul --ab-layout, separate runs)
    dw = f.half16(wb, 0)
    dmin = None if q3 else f.half16(wb, 32)
    heads = [[f.load("<64 x i8>", wb, at + 64 * i) for i in range(4)] for at in ((sc_at,) if q3 else (sc_at, 320))]

    def scale(k: int, g: int) -> str:
        part = f.let(f"shufflevector <64 x i8> {heads[k][g // 4]}, <64 x i8> poison, "
                     f"<16 x i32> <{', '.join(f'i32 {16 * (g % 4) + i}' for i in range(16))}>")
        return f.let(f"{'sext' if q3 else 'zext'} <16 x i8> {part} to {V16I}")

    isums, msums = [""] * len(xs), [""] * len(xs)

    def add(total: str, term: str) -> str:
        return f.let(f"add {V16I} {total}, {term}") if total else term

    for h in range(2):
        for s in range(2):
            q = [f.load("<64 x i8>", wb, qs_at + 512 * h + 64 * (4 * s + c)) for c in range(4)]
            hm = [f.load("<64 x i8>", wb, 288 + 64 * (4 * s + c)) for c in range(4)] if q3 else []
            for j in range(4):
                g = 8 * h + 2 * j + s
                chunks = [f.shift_bytes(v, "lshr", 2 * j, 3) if j else f.let(f"and <64 x i8> {v}, {splat_i8(64, 3)}")
                          for v in q]
                if q3:
                    chunks = [f.let(f"or <64 x i8> {ch}, {_bit_to(f, m, 4 * h + j, 2)}") for ch, m in zip(chunks, hm)]
                sc = scale(0, g)
                mn = None if q3 else scale(1, g)
                for t, x in enumerate(xs):
                    c16_g = f.load("i32", x, f.add(c16, 4 * g), 4)
                    dot = f.splat_i32(f.let(f"ashr i32 {c16_g}, 3")) if q3 else "zeroinitializer"
                    for c in range(4):
                        dot = dots.dot(dot, chunks[c], f.bcast(x, f.add(qs_x, 128 * h + 32 * j + 16 * s + 4 * c)))
                    isums[t] = add(isums[t], f.let(f"mul {V16I} {dot}, {sc}"))
                    if mn is not None:
                        msums[t] = add(msums[t], f.let(f"mul {V16I} {mn}, {f.splat_i32(c16_g)}"))
    out = []
    for t, x in enumerate(xs):
        acc = [f.fma(16, f.tofloat(isums[t]), _x_scale(f, act, x, b, dw), accs[t][0])]
        if not q3:
            assert dmin is not None
            mins = f.let(f"fmul {V16F} {_x_scale(f, act, x, b, dmin)}, {_ONE_32ND}")
            acc.append(f.fma(16, f.tofloat(msums[t]), mins, accs[t][1]))
        out.append(acc)
    return out


_ONE_32ND = "<" + ", ".join(["float 0x3FA0000000000000"] * 16) + ">"  # 1/32 in every lane: exact


def _bit_to(f: KernelFn, v: str, k: int, to: int) -> str:
    """Bit k of each byte of v, moved to bit `to` (the other bits 0)."""
    if k == to:
        return f.let(f"and <64 x i8> {v}, {splat_i8(64, 1 << to)}")
    return f.shift_bytes(v, "lshr" if k > to else "shl", abs(k - to), 1 << to)


def _q5_top_bits(f: KernelFn, qh: str, first: int) -> str:
    """Bits first..first+3 of each lane's qh, as bit 4 of its four bytes (a multiply spreads
    4 bits to bytes 0..3: x * 0x204081 is x | x << 7 | x << 14 | x << 21, no carries)."""
    t = f.let(f"and {V16I} {f.let(f'lshr {V16I} {qh}, {i32x16(first)}') if first else qh}, {i32x16(15)}")
    t = f.let(f"mul {V16I} {t}, {i32x16(0x204081 << 4)}")
    return f.let(f"bitcast {V16I} {f.let(f'and {V16I} {t}, {i32x16(0x10101010)}')} to <64 x i8>")


def _body_q4_0(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_offset(f, dots, act, wb, b, xs, accs, None, 4)


def _body_q5_0(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_offset(f, dots, act, wb, b, xs, accs, 256, 3)


def _body_offset(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
                 accs: Sequence[Sequence[str]], qh_at: int | None, shift: int) -> list[list[str]]:
    """Q4_0/Q5_0: as Q8_0 with q = nibble (| 5th bit << 4 with qh: unsigned, 0..15 or 0..31)
    and the offset -8 or -16 * sum(y) (the r8_0 row's c >> 4 or >> 3, exact) as the starting
    value."""
    chunks = _legacy_chunks(f, wb, qh_at)
    qs = f.mul(b, 32)
    dw = f.half16(wb, 256 + (64 if qh_at is not None else 0))
    out = []
    for acc, x in zip(accs, xs):
        c = f.let(f"ashr {V16I} {f.bcast(x, f.add(act.c_at, f.mul(b, 4)))}, {i32x16(shift)}")
        for k in range(8):
            c = dots.dot(c, chunks[k], f.bcast(x, f.add(qs, 4 * k)))
        out.append([f.fma(16, _x_scale(f, act, x, b, dw), f.tofloat(c), acc[0])])
    return out


def _legacy_chunks(f: KernelFn, wb: str, qh_at: int | None, at: int = 0) -> list[str]:
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
    chunks = _legacy_chunks(f, wb, qh_at)
    at = 256 + (64 if qh_at is not None else 0)
    dw, mw = f.half16(wb, at), f.half16(wb, at + 32)
    qs = f.mul(b, 32)
    out = []
    for acc, x in zip(accs, xs):
        isum = "zeroinitializer"
        for k in range(8):
            isum = dots.dot(isum, chunks[k], f.bcast(x, f.add(qs, 4 * k)))
        acc0 = f.fma(16, _x_scale(f, act, x, b, dw), f.tofloat(isum), acc[0])
        sx = f.splat_float(f.load("float", x, f.add(act.c_at, f.mul(b, 4)), 4), 16)
        out.append([f.fma(16, mw, sx, acc0)])
    return out


def _body_q4_1(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q4_5_1(f, dots, act, wb, b, xs, accs, None)


def _body_q5_1(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q4_5_1(f, dots, act, wb, b, xs, accs, 256)


def _x_scale(f: KernelFn, act: Act, x: str, b: str, w_scale: str) -> str:
    """w_scale * dx[b] for one activation row (16 weight rows' products)."""
    dx = f.splat_float(f.load("float", x, f.add(act.d_at, f.mul(b, 4)), 4), 16)
    return f.let(f"fmul {V16F} {w_scale}, {dx}")


# The K-quant bodies read a block's quants front to back. Read lane by lane (strides of 512
# and 768 bytes inside a 2368/3360-byte block), the hardware prefetchers lost the stream: one
# thread, M = 1, 5632x2048 from DRAM, Q4_K 10-12 -> 25-31 GB/s and Q6_K 7 -> 23-26 GB/s in
# memory order (the file layout: 23 and 20). The integer lane sums are the same either way.
def _body_q4_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q4_5_k(f, dots, act, wb, b, xs, accs, qh_at=None)


def _body_q5_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q4_5_k(f, dots, act, wb, b, xs, accs, qh_at=320)


def _fifth_bit(f: KernelFn, qh: str, j: int) -> str:
    """Bit j of each byte of qh, moved to bit 4 (Q5_K's 5th bit of sub-block j's values)."""
    if j == 4:
        return f.let(f"and <64 x i8> {qh}, {splat_i8(64, 0x10)}")
    return f.shift_bytes(qh, "shl", 4 - j, 0x10) if j < 4 else f.shift_bytes(qh, "lshr", j - 4, 0x10)


_CHAINS = 2  # dot chains per sub-block and row when a tile has one row


def _body_q4_5_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
                 accs: Sequence[Sequence[str]], qh_at: int | None) -> list[list[str]]:
    """Whole-block arithmetic, as llama.cpp's x86 kernels for repacked Q4_K (q4_K_8x8) do it:
    per row an exact int32 isum = sum_j sc_j * dot_j and minsum = sum_j mn_j * b32_j, then
    acc = fma(float(isum), d * dx, acc) and nacc = fma(float(minsum), -(dmin * dx), nacc), the
    result acc + nacc (llama.cpp's acc - acc_min: the negation is exact). A single row sums
    each sub-block's dot in _CHAINS independent chains of vpdpbusd (integer adds: the same
    sum). The quants are read in the block's memory order (pair p, then chunk i). Q5_K (qh_at):
    values | 16 where the chunk's qh bit of the sub-block is set."""
    qs_at = 320 if qh_at is None else qh_at + 512
    qs = f.mul(b, 256)
    b32 = f.add(act.b32_at, f.mul(b, 16))
    # the block's head first (read after the quants, it broke the stream the hardware
    # prefetchers follow: 2 threads, 1.1B Q4_K_M decode 33-42 -> 27-33 tok/s); the mins fold
    # at once, so a tile's registers hold only the scales beside its chains
    dw, dmin = f.half16(wb, 0), f.half16(wb, 32)
    sc = [f.widen16(wb, 64 + 16 * j, signed=False) for j in range(8)]
    mn = [f.widen16(wb, 192 + 16 * j, signed=False) for j in range(8)]
    mn_pairs = [f.let(f"or {V16I} {mn[2 * p]}, {f.let(f'shl {V16I} {mn[2 * p + 1]}, {i32x16(16)}')}")
                for p in range(4)]
    naccs = []
    for t, x in enumerate(xs):
        minsum = "zeroinitializer"
        for p in range(4):  # (b32_2p, b32_2p+1) against (mn_2p, mn_2p+1): two products a lane
            minsum = dots.wdot(minsum, f.bcast(x, f.add(b32, 4 * p)), mn_pairs[p])
        ndm = f.let(f"fneg {V16F} {_x_scale(f, act, x, b, dmin)}")
        naccs.append(f.fma(16, f.tofloat(minsum), ndm, accs[t][1]))
    n_chains = _CHAINS if len(xs) == 1 else 1
    isums = [""] * len(xs)
    for p in range(4):
        chains = [[["zeroinitializer"] * n_chains for _ in range(2)] for _ in xs]
        for i in range(8):
            v = f.load("<64 x i8>", wb, qs_at + 512 * p + 64 * i)
            nib = (f.let(f"and <64 x i8> {v}, {splat_i8(64, 15)}"),
                   f.shift_bytes(v, "lshr", 4, 15))
            if qh_at is not None:
                qh = f.load("<64 x i8>", wb, qh_at + 64 * i)
                nib = (f.let(f"or <64 x i8> {nib[0]}, {_fifth_bit(f, qh, 2 * p)}"),
                       f.let(f"or <64 x i8> {nib[1]}, {_fifth_bit(f, qh, 2 * p + 1)}"))
            for t, x in enumerate(xs):
                for h in range(2):
                    c = chains[t][h]
                    c[i % n_chains] = dots.dot(c[i % n_chains], nib[h],
                                               f.bcast(x, f.add(qs, 64 * p + 32 * h + 4 * i)))
        # the pair's dots fold into the isum at once: a tile row holds 2 chains, not 8
        for t in range(len(xs)):
            for h in range(2):
                d = chains[t][h][0]
                for more in chains[t][h][1:]:
                    d = f.let(f"add {V16I} {d}, {more}")
                term = f.let(f"mul {V16I} {d}, {sc[2 * p + h]}")
                isums[t] = f.let(f"add {V16I} {isums[t]}, {term}") if isums[t] else term
    return [[f.fma(16, f.tofloat(isums[t]), _x_scale(f, act, x, b, dw), accs[t][0]), naccs[t]]
            for t, x in enumerate(xs)]


def _q6_field(f: KernelFn, h: str, k: int) -> str:
    """2-bit field k of each byte of h, moved to bits 4..5."""
    if k < 2:
        return f.shift_bytes(h, "shl", 4 - 2 * k, 0x30)
    if k == 3:
        return f.shift_bytes(h, "lshr", 2, 0x30)
    return f.let(f"and <64 x i8> {h}, {splat_i8(64, 0x30)}")


def _body_q6_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    """Whole-block arithmetic, as Q4_K's: per row an exact int32 isum = sum_j sc_j * (dot_j -
    32 * bsum_j) over the 16 sub-blocks (each sub-block's chain of 4 vpdpbusd starts from the
    activation's c16_j = -32 * bsum_j), then acc = fma(float(isum), d * dx, acc). Step s of the
    repacked block holds sub-blocks s (low nibbles) and 8 + s (high nibbles), read in memory
    order; each step's two chains fold into the isum as they complete."""
    qs = f.mul(b, 256)
    c16 = f.add(act.c_at, f.mul(b, 64))
    # a single row reads the block's head first, as Q4_K (the hardware prefetchers follow the
    # block in order: one thread, M = 1, 1.10-1.17x); a tile's rows take each scale where it is
    # used (16 scales in registers beside a tile's chains: M = 8 and 512 at 0.65-0.83x)
    dw = f.half16(wb, 0)

    def scale(j: int) -> str:
        return f.widen16(wb, 32 + 16 * j, signed=True)

    head = [scale(j) for j in range(16)] if len(xs) == 1 else []
    isums = [""] * len(xs)
    for s in range(8):
        qh = [f.load("<64 x i8>", wb, 288 + 384 * s + 256 + 64 * p) for p in range(2)]
        chains = [[f.bcast(x, f.add(c16, 4 * j)) for j in (s, 8 + s)] for x in xs]
        for i in range(4):
            p, c = divmod(i, 2)
            ql = f.load("<64 x i8>", wb, 288 + 384 * s + 64 * i)
            lo = f.let(f"and <64 x i8> {ql}, {splat_i8(64, 15)}")
            hi = f.shift_bytes(ql, "lshr", 4, 15)
            chunks = (f.let(f"or <64 x i8> {lo}, {_q6_field(f, qh[p], c)}"),
                      f.let(f"or <64 x i8> {hi}, {_q6_field(f, qh[p], 2 + c)}"))
            for t, x in enumerate(xs):
                for h, ch in enumerate((4 * s + i, 32 + 4 * s + i)):
                    chains[t][h] = dots.dot(chains[t][h], chunks[h], f.bcast(x, f.add(qs, 4 * ch)))
        for t in range(len(xs)):
            for h, j in enumerate((s, 8 + s)):
                term = f.let(f"mul {V16I} {chains[t][h]}, {head[j] if head else scale(j)}")
                isums[t] = f.let(f"add {V16I} {isums[t]}, {term}") if isums[t] else term
    return [[f.fma(16, f.tofloat(isums[t]), _x_scale(f, act, x, b, dw), accs[t][0])]
            for t, x in enumerate(xs)]


BODIES: dict[T, _Body] = {T.Q8_0: _body_q8_0, T.Q4_0: _body_q4_0, T.Q5_0: _body_q5_0,
                          T.IQ4_NL: _body_iq4_nl, T.Q4_1: _body_q4_1, T.Q5_1: _body_q5_1,
                          T.Q2_K: _body_q2_k, T.Q3_K: _body_q3_k, T.Q4_K: _body_q4_k,
                          T.Q5_K: _body_q5_k, T.Q6_K: _body_q6_k, T.IQ4_XS: _body_iq4_xs}
# accumulators per (16 weight rows, activation row)
LANES = {T.Q8_0: 1, T.Q4_0: 1, T.Q5_0: 1, T.IQ4_NL: 1, T.IQ4_XS: 1, T.Q2_K: 2, T.Q3_K: 1, T.Q4_1: 1,
         T.Q5_1: 1, T.Q4_K: 2, T.Q5_K: 2, T.Q6_K: 1}
# the types whose results are the file-layout kernels' bits (tests/test_gemm.py asserts it)
FILE_LAYOUT_BITS = frozenset({T.Q4_K, T.Q5_K, T.Q6_K})


def supported(qtype: T, isa: str) -> bool:
    """Whether this module has a kernel for qtype on isa (AVX2 maddubs would saturate on the
    u8 weights of Q8_0 and the codebook types, up to 255 and 241)."""
    return qtype in BODIES and not (qtype in (T.Q8_0, T.IQ4_NL, T.IQ4_XS) and isa == "avx2")


def _lane_sum(f: KernelFn, v: list[str]) -> str:
    """A row's accumulators summed: Q4_K/Q5_K's acc + nacc (hsum_halves of kquants.fold_whole's
    accumulator, whose other lanes are 0)."""
    return v[0] if len(v) == 1 else f.let(f"fadd {V16F} {v[0]}, {v[1]}")


def _prefetch_lines(f: KernelFn, at: str, first: int, stop: int) -> None:
    """Cache lines first..stop-1 from `at` into L2 (a prefetch never faults: past the last
    group it is dropped)."""
    for line in range(first, stop):
        f.do(f"call void @llvm.prefetch.p0(ptr {f.gep(at, 64 * line)}, i32 0, i32 2, i32 1)")


# the intrinsics an interleaved module declares (engine.kernels.ir.intrinsics), in its order
INTRINSICS = (
    "llvm.prefetch.p0", "llvm.x86.avx512.vpdpbusd.512", "llvm.x86.avx512.vpdpwssd.512",
    "llvm.x86.avx512.pshuf.b.512", "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd",
    "llvm.fma.v16f32", "llvm.fabs.v32f32", "llvm.roundeven.v32f32", "llvm.vector.reduce.fmax.v32f32",
    "llvm.maxnum.f32", "llvm.fabs.f32", "llvm.vector.reduce.add.v16i32", "llvm.vector.reduce.add.v32i32",
)
_ARGS = "ptr noalias %w, ptr noalias %xq, ptr noalias %out, i64 %nb, i64 %r0, i64 %r1, i64 %M, i64 %N"


def _build_gemm(qtype: T, isa: str, tile: int, fname: str, one_row: str | None = None,
                noinline: bool = False) -> str:
    """The loop nest as function `fname`; with `one_row`, calls of one row go to that
    function (the same nest for single rows, compiled alone and kept out of line: inside the
    tiled function the single-row loop ran 3-8% slower at M = 1, its registers allotted around
    the tile's)."""
    f = KernelFn(f"void @{fname}({_ARGS})" + (" noinline" if noinline else ""))
    if one_row is not None:
        small = f.let("icmp ult i64 %M, 2")
        f.do(f"br i1 {small}, label %one_row, label %tiled")
        f.label("one_row")
        f.do(f"call void @{one_row}({_ARGS.replace('noalias ', '')})")
        f.do("ret void")
        f.label("tiled")
    dots = Dots(f, isa)
    act = Act(f, ACTIVATION[qtype])
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
            # the next group into L2, block by block, during the call's second tile, which
            # computes from cache: else the next group's first tile waits on memory. With just
            # two tiles the first takes half of it (one tile's compute is too short to cover
            # fetching a group). One thread, 1.1B shapes: Q4_K 1.10-1.21x (M = 4 and 8), Q6_K
            # 1.06-1.12x (M = 4); the split, at M = 8: Q6_K 1.17-1.28x, Q8_0 1.45x more
            lo: str | None = None
            hi: str | None = None
            if rows == tile > 1:
                hi = f.let(f"icmp eq i64 {m0}, {tile}")
                lo = f.select(f.let(f"icmp eq i64 {n_tiles}, 2"), "i1", f.let(f"icmp eq i64 {m0}, 0"), hi)
            n_lines = (GROUP_BLOCK_BYTES[qtype] + 63) // 64

            def block(b: str, flat: list[str]) -> list[str]:
                wb = f.gep(wg, f.mul(b, GROUP_BLOCK_BYTES[qtype]))
                if tile == 1 and qtype in ONE_ROW_PREFETCH:
                    _prefetch_lines(f, f.gep(wb, ONE_ROW_PREFETCH[qtype]), 0, n_lines)
                if lo is not None and hi is not None:
                    nxt = f.gep(wb, group_bytes)
                    f.if_then(lo, functools.partial(_prefetch_lines, f, nxt, 0, n_lines // 2))
                    f.if_then(hi, functools.partial(_prefetch_lines, f, nxt, n_lines // 2, n_lines))
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

        def smaller_tile(at: str, size: int) -> str:
            tile_rows(at, size)
            return f.add(at, size)

        rest = rest0
        for size in range(tile - 1, 1, -1):  # the rows left: one smaller tile, then singles
            left = f.let(f"sub i64 %M, {rest}")
            rest = f.if_value(f.let(f"icmp uge i64 {left}, {size}"), "i64",
                              functools.partial(smaller_tile, rest, size), rest)
        f.loop_range(rest, "%M", lambda m: tile_rows(m, 1))

    f.loop_range(g0, g1, group)
    f.do("ret void")
    return f.text()


def build_gemm_ir(qtype: T, isa: str, tile: int | None = None) -> str:
    """The module for one weight type: its activation quantizer and its gemm function."""
    tile = TILES[qtype] if tile is None else tile
    if not supported(qtype, isa):
        raise ValueError(f"no interleaved kernel for {qtype.name} on {isa}")
    name = f"gemm_{qtype.name.lower()}"
    head = NO_MACHINE_SCHEDULER + declarations(*INTRINSICS) + build_quantize(ACTIVATION[qtype])
    if tile == 1:
        return head + _build_gemm(qtype, isa, 1, name)
    return (head + _build_gemm(qtype, isa, 1, f"{name}_one", noinline=True)
            + _build_gemm(qtype, isa, tile, name, one_row=f"{name}_one"))
