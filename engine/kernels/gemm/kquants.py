"""The interleaved family's bodies for the super-block types (Q2_K .. Q6_K, IQ4_XS): a whole
super-block of 16 weight rows summed in exact int32 per lane, then scaled once (engine.formats.repack
has the layouts and the arithmetic, gemm.build the loop nest that calls them)."""
from __future__ import annotations

from collections.abc import Sequence

from engine.formats.quant_iq import CODEBOOK
from engine.kernels.gemm.legacy import legacy_chunks, x_scale
from engine.kernels.gemm.quantizer import Act
from engine.kernels.ir.consts import V16F, V16I, i32x16, splat_i8
from engine.kernels.ir.intdot import Dots
from engine.kernels.ir.vectors import KernelFn


def body_iq4_xs(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
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
        chunks = [dots.lookup(c, table) for c in legacy_chunks(f, wb, None, at=160 + 256 * j)]
        sc = f.widen16(wb, 32 + 16 * j, signed=True)
        for t, x in enumerate(xs):
            halves = [f.load("i32", x, f.add(c16, 8 * j + 4 * h), 4) for h in range(2)]
            dot = f.splat_i32(f.let(f"shl i32 {f.let(f'add i32 {halves[0]}, {halves[1]}')}, 2"))
            for k in range(8):
                dot = dots.dot(dot, chunks[k], f.bcast(x, f.add(qs, 32 * j + 4 * k)))
            term = f.let(f"mul {V16I} {dot}, {sc}")
            isums[t] = f.let(f"add {V16I} {isums[t]}, {term}") if isums[t] else term
    return [[f.fma(16, f.tofloat(isums[t]), x_scale(f, act, x, b, dw), accs[t][0])]
            for t, x in enumerate(xs)]


def body_q2_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q2_3_k(f, dots, act, wb, b, xs, accs, q3=False)


def body_q3_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
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
        acc = [f.fma(16, f.tofloat(isums[t]), x_scale(f, act, x, b, dw), accs[t][0])]
        if not q3:
            assert dmin is not None
            mins = f.let(f"fmul {V16F} {x_scale(f, act, x, b, dmin)}, {_ONE_32ND}")
            acc.append(f.fma(16, f.tofloat(msums[t]), mins, accs[t][1]))
        out.append(acc)
    return out


_ONE_32ND = "<" + ", ".join(["float 0x3FA0000000000000"] * 16) + ">"  # 1/32 in every lane: exact


def _bit_to(f: KernelFn, v: str, k: int, to: int) -> str:
    """Bit k of each byte of v, moved to bit `to` (the other bits 0)."""
    if k == to:
        return f.let(f"and <64 x i8> {v}, {splat_i8(64, 1 << to)}")
    return f.shift_bytes(v, "lshr" if k > to else "shl", abs(k - to), 1 << to)


# The K-quant bodies read a block's quants front to back. Read lane by lane (strides of 512
# and 768 bytes inside a 2368/3360-byte block), the hardware prefetchers lost the stream: one
# thread, M = 1, 5632x2048 from DRAM, Q4_K 10-12 -> 25-31 GB/s and Q6_K 7 -> 23-26 GB/s in
# memory order (the file layout: 23 and 20). The integer lane sums are the same either way.
def body_q4_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
               accs: Sequence[Sequence[str]]) -> list[list[str]]:
    return _body_q4_5_k(f, dots, act, wb, b, xs, accs, qh_at=None)


def body_q5_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
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
        ndm = f.let(f"fneg {V16F} {x_scale(f, act, x, b, dmin)}")
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
    return [[f.fma(16, f.tofloat(isums[t]), x_scale(f, act, x, b, dw), accs[t][0]), naccs[t]]
            for t, x in enumerate(xs)]


def _q6_field(f: KernelFn, h: str, k: int) -> str:
    """2-bit field k of each byte of h, moved to bits 4..5."""
    if k < 2:
        return f.shift_bytes(h, "shl", 4 - 2 * k, 0x30)
    if k == 3:
        return f.shift_bytes(h, "lshr", 2, 0x30)
    return f.let(f"and <64 x i8> {h}, {splat_i8(64, 0x30)}")


def body_q6_k(f: KernelFn, dots: Dots, act: Act, wb: str, b: str, xs: list[str],
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
    return [[f.fma(16, f.tofloat(isums[t]), x_scale(f, act, x, b, dw), accs[t][0])]
            for t, x in enumerate(xs)]
