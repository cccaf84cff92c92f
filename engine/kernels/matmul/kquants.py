"""The K-quant tiles (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: super-blocks of 256 values) against q8_k
activations.

Each type has a body that unpacks one weight super-block and integer-dots it with the same block
of several activation rows (q8_k: f32 d | i8 qs[256] | i16 bsums[16], row by row); the block's
terms are folded into the row's <8 x float> accumulator. super_block_tiles turns a body into the
callbacks of loops.emit_rows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.formats.activations import ACTIVATION_LAYOUTS
from engine.formats.quants import QuantType
from engine.kernels.ir.consts import V8F, i8_const, shuffle_mask, splat_const
from engine.kernels.ir.intdot import IntOps
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.matmul.loops import RowCallbacks, row_tiles

# A body handles one weight block against the same block of several activation rows: it unpacks
# the weights once and returns, per row, the block's contribution as terms
#     Term(value, scale): float(value) * scale, value <8 x i32>, scale a splat
# which fold adds into that row's <8 x float> accumulator.

@dataclass(frozen=True)
class Term:
    value: str  # <8 x i32>
    scale: str  # <8 x float>, a splat


Terms = list[Term]
Body = Callable[[KernelFn, IntOps, str, list[str]], list[Terms]]

# Independent integer accumulators per row and block in tiles of up to CHAINS_ROWS rows (their
# sum is the same integers). One thread, rows kernel, 512 x 2048 Q4_K in L2: M = 1 18.6 -> 19.8
# GB/s with 2 chains; M = 8 5.2 -> 4.8 (8 rows' chains already overlap, and 16 accumulators
# crowd the registers), so bigger tiles keep one.
CHAINS = 2
CHAINS_ROWS = 2


class ISums:
    """Per activation row, a block's scaled integer sums, madd(maddubs(q, y), scale) added up
    in CHAINS accumulators taken in turn (one chain of dependent vpdpwssd per block limits a
    single row's speed), summed at the end: integer adds, so the same <8 x i32> either way."""

    def __init__(self, f: KernelFn, ops: IntOps, rows: int) -> None:
        self.f, self.ops = f, ops
        chains = CHAINS if rows <= CHAINS_ROWS else 1
        self.accs = [["zeroinitializer"] * chains for _ in range(rows)]
        self.turn = [0] * rows

    def add(self, t: int, pairs: str, scale: str) -> None:
        """Row t += madd(pairs, scale); pairs is maddubs' <16 x i16>."""
        k = self.turn[t]
        self.accs[t][k] = self.ops.madd_acc(self.accs[t][k], pairs, scale)
        self.turn[t] = (k + 1) % len(self.accs[t])

    def total(self, t: int) -> str:
        v = self.accs[t][0]
        for a in self.accs[t][1:]:
            v = v if a == "zeroinitializer" else self.f.let(f"add <8 x i32> {v}, {a}")
        return v


def k_scales_mins(f: KernelFn, w: str) -> tuple[str, str]:
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


def _add_scaled(f: KernelFn, ops: IntOps, q: str, scale: str, xs: list[str], y_at: int,
                isums: ISums) -> None:
    """isums[t] += madd(maddubs(q, y_t), scale) for the 32 activation values at y_at of each row:
    q unsigned, scale <16 x i16> (one i16 per pair of maddubs lanes)."""
    for t, x in enumerate(xs):
        isums.add(t, ops.maddubs(q, f.load("<32 x i8>", x, y_at)), scale)


def _with_mins(f: KernelFn, ops: IntOps, xs: list[str], isums: ISums, d: str, dmin: str,
               mn16: str) -> list[Terms]:
    """Per activation row (q8_k: f32 dx at 0, i16 bsums at 260): the terms d*dx * isum and
    -dmin*dx * madd(bsums, mn16), the block mins of Q2_K, Q4_K and Q5_K."""
    out: list[Terms] = []
    for t, x in enumerate(xs):
        dx = f.f32_splat(x, 0)
        minsum = ops.madd(f.load("<16 x i16>", x, 260), mn16)
        neg_dmin_dx = f.let(f"fneg <8 x float> {f.let(f'fmul <8 x float> {dmin}, {dx}')}")
        out.append([Term(isums.total(t), f.let(f"fmul <8 x float> {d}, {dx}")), Term(minsum, neg_dmin_dx)])
    return out


def _pair_scales(f: KernelFn, sc16: str, g: int) -> str:
    """<16 x i16> [sc16[g] x8, sc16[g + 1] x8]: the scales of values 16g .. 16g + 31."""
    return f.let(f"shufflevector <16 x i16> {sc16}, <16 x i16> poison, {shuffle_mask([g] * 8 + [g + 1] * 8)}")


def _low2(f: KernelFn, qs: str, j: int) -> str:
    """Bits 2j, 2j + 1 of each byte: Q2_K/Q3_K's 2-bit field j of a 32-byte chunk."""
    shifted = qs if j == 0 else f.let(f"lshr <32 x i8> {qs}, {splat_const('i8', 32, 2 * j)}")
    return f.let(f"and <32 x i8> {shifted}, {splat_const('i8', 32, 3)}")


def q2_k_body(t: QuantType) -> Body:
    """Q2_K against q8_k.

    Values 128h + 32j + l (l < 32) are bits 2j.. of qs[32h + l], in 16 sub-blocks of 16 with
    4-bit scale sc and min mn (scales[g] = sc | mn << 4). As in Q6_K, maddubs' i16 lanes split
    a 32-value vector into its two sub-blocks, so madd with [sc[g] x8, sc[g+1] x8] scales them;
    the mins take the activation block sums: minsum = madd(bsums, mn).
    Terms: d*dx * isum and -dmin*dx * minsum.
    """
    qs_at, d_at, dmin_at, scales_at = (t.offset(k) for k in ("qs", "d", "dmin", "scales"))

    def block(f: KernelFn, ops: IntOps, w: str, xs: list[str]) -> list[Terms]:
        d, dmin = f.f16_splat(w, d_at), f.f16_splat(w, dmin_at)
        packed = f.load("<16 x i8>", w, scales_at)
        sc = f.let(f"and <16 x i8> {packed}, {splat_const('i8', 16, 15)}")
        mn = f.let(f"lshr <16 x i8> {packed}, {splat_const('i8', 16, 4)}")
        sc16 = f.let(f"zext <16 x i8> {sc} to <16 x i16>")
        mn16 = f.let(f"zext <16 x i8> {mn} to <16 x i16>")
        isums = ISums(f, ops, len(xs))
        for h in range(2):
            qs = f.load("<32 x i8>", w, qs_at + 32 * h)
            for j in range(4):
                _add_scaled(f, ops, _low2(f, qs, j), _pair_scales(f, sc16, 8 * h + 2 * j), xs,
                            4 + 128 * h + 32 * j, isums)
        return _with_mins(f, ops, xs, isums, d, dmin, mn16)

    return block


def q3_k_scales(f: KernelFn, w: str, at: int) -> str:
    """Q3_K's 12 scale bytes at w + at -> <16 x i16> signed scales (6 bits, minus 32).

    Scale k: low 4 bits from byte k % 8 (its low nibble for k < 8, else its high one), top 2
    bits from bits 2 (k // 4) of byte 8 + k % 4.
    """
    b8 = f.load("<8 x i8>", w, at)
    lo, hi = f.nibble_halves(b8, 8)
    low = f.let(f"shufflevector <8 x i8> {lo}, <8 x i8> {hi}, {shuffle_mask(range(16))}")
    top = f.let(f"shufflevector <4 x i8> {f.load('<4 x i8>', w, at + 8)}, <4 x i8> poison, "
                f"{shuffle_mask(list(range(4)) * 4)}")
    top = f.field(top, 16, "i8", [2 * (k // 4) for k in range(16)], 3)
    top = f.let(f"shl <16 x i8> {top}, {splat_const('i8', 16, 4)}")
    sc = f.let(f"zext <16 x i8> {f.let(f'or <16 x i8> {low}, {top}')} to <16 x i16>")
    return f.let(f"sub <16 x i16> {sc}, {splat_const('i16', 16, 32)}")


def q3_k_body(t: QuantType) -> Body:
    """Q3_K against q8_k.

    As Q2_K, plus a third bit: bit 4h + j of hmask[l]; q = low2 - (bit ? 0 : 4). The kernel
    takes qu = low2 | (bit ? 4 : 0) (unsigned, 0..7, for maddubs) and takes the 4 off once, as
    Q6_K does its 32: corr = 4 * madd(bsums, sc). Term: d*dx * (isum - corr).
    """
    qs_at, hm_at, scales_at, d_at = (t.offset(k) for k in ("qs", "hmask", "scales", "d"))

    def block(f: KernelFn, ops: IntOps, w: str, xs: list[str]) -> list[Terms]:
        d = f.f16_splat(w, d_at)
        sc16 = q3_k_scales(f, w, scales_at)
        hm = f.load("<32 x i8>", w, hm_at)
        isums = ISums(f, ops, len(xs))
        for h in range(2):
            qs = f.load("<32 x i8>", w, qs_at + 32 * h)
            for j in range(4):
                bit = f.let(f"and <32 x i8> {hm}, {splat_const('i8', 32, i8_const(1 << (4 * h + j)))}")
                is_set = f.let(f"icmp ne <32 x i8> {bit}, zeroinitializer")
                high = f.let(f"select <32 x i1> {is_set}, <32 x i8> {splat_const('i8', 32, 4)}, "
                             f"<32 x i8> zeroinitializer")
                q = f.let(f"or <32 x i8> {_low2(f, qs, j)}, {high}")
                _add_scaled(f, ops, q, _pair_scales(f, sc16, 8 * h + 2 * j), xs, 4 + 128 * h + 32 * j, isums)
        return _minus_offset(f, ops, xs, isums, sc16, d, 2)

    return block


def _minus_offset(f: KernelFn, ops: IntOps, xs: list[str], isums: ISums, sc16: str,
                  d: str, shift: int) -> list[Terms]:
    """Per activation row: the block's integer sum less the type's constant offset (its
    16-value sub-block scales times q8_k's block sums, shifted left by `shift`: 2 for Q3_K's -4,
    5 for Q6_K's -32), scaled by d * dx."""
    out: list[Terms] = []
    for i, x in enumerate(xs):
        dx = f.f32_splat(x, 0)
        corr = ops.madd(f.load("<16 x i16>", x, 260), sc16)
        corr = f.let(f"shl <8 x i32> {corr}, {splat_const('i32', 8, shift)}")
        isum = f.let(f"sub <8 x i32> {isums.total(i)}, {corr}")
        out.append([Term(isum, f.let(f"fmul <8 x float> {d}, {dx}"))])
    return out


def q4_5_k_body(t: QuantType) -> Body:
    """Q4_K / Q5_K against q8_k (f32 dx | i8 y[256] | i16 bsums[16]).

    Per chunk c of 32 qs bytes: low nibbles are sub-block 2c, high nibbles 2c+1 (Q5_K: plus 16
    where bit 2c / 2c+1 of qh[l] is set). isum += madd(maddubs(q, y), splat(sc[j])) keeps the
    scaled integer sums in i32 lanes; the mins need only the activation block sums:
    sum_j mn[j] * (bsums[2j] + bsums[2j+1]) = madd(bsums, mn with each repeated twice).
    Terms: d*dx * isum and -dmin*dx * minsum.
    """
    qs_at = t.offset("qs")
    qh_at = t.offset("qh") if t.has("qh") else None  # Q5_K

    def block(f: KernelFn, ops: IntOps, w: str, xs: list[str]) -> list[Terms]:
        d, dmin = f.f16_splat(w, 0), f.f16_splat(w, 2)
        sc, mn = k_scales_mins(f, w)
        mn16 = f.let(f"shufflevector <8 x i16> {mn}, <8 x i16> poison, {shuffle_mask(j // 2 for j in range(16))}")
        qh = f.load("<32 x i8>", w, qh_at) if qh_at is not None else None
        isums = ISums(f, ops, len(xs))
        for c in range(4):
            qs = f.load("<32 x i8>", w, qs_at + 32 * c)
            halves = f.nibble_halves(qs, 32)
            for h in range(2):
                j = 2 * c + h
                q = halves[h]
                if qh is not None:
                    bit = f.let(f"and <32 x i8> {qh}, {splat_const('i8', 32, i8_const(1 << j))}")
                    is_set = f.let(f"icmp ne <32 x i8> {bit}, zeroinitializer")
                    high = f.let(f"select <32 x i1> {is_set}, <32 x i8> {splat_const('i8', 32, 16)}, "
                                 f"<32 x i8> zeroinitializer")
                    q = f.let(f"or <32 x i8> {q}, {high}")
                scale = f.let(f"shufflevector <8 x i16> {sc}, <8 x i16> poison, {shuffle_mask([j] * 16)}")
                for r, x in enumerate(xs):
                    isums.add(r, ops.maddubs(q, f.load("<32 x i8>", x, 4 + 32 * j)), scale)
        return _with_mins(f, ops, xs, isums, d, dmin, mn16)

    return block


def q6_k_body() -> Body:
    """Q6_K against q8_k.

    Per half h and l < 32 the four 6-bit vectors are built from ql[64h + l], ql[64h + 32 + l] and
    the 2-bit fields of qh[32h + l] (see engine/formats/quant_k.py); vector v covers values 128h + 32v +
    (0..31), whose scales are scales[8h + 2v] (first 16) and scales[8h + 2v + 1] (next 16): the
    i16 lanes of maddubs split the same way, so madd with [s_a x8, s_b x8] applies them.
    q is unsigned (0..63); the -32 offset comes off once: corr = 32 * madd(bsums, scales).
    Term: d*dx * (isum - corr).
    """

    def block(f: KernelFn, ops: IntOps, w: str, xs: list[str]) -> list[Terms]:
        d = f.f16_splat(w, 208)
        sc16 = f.let(f"sext <16 x i8> {f.load('<16 x i8>', w, 192)} to <16 x i16>")
        isums = ISums(f, ops, len(xs))
        low4, hi2 = splat_const("i8", 32, 15), splat_const("i8", 32, 0x30)
        for h in range(2):
            qa = f.load("<32 x i8>", w, 64 * h)
            qb = f.load("<32 x i8>", w, 64 * h + 32)
            qh = f.load("<32 x i8>", w, 128 + 32 * h)
            # the 2-bit fields qh >> 0, 2, 4, 6, each moved to bits 4..5
            moved = [f.let(f"shl <32 x i8> {qh}, {splat_const('i8', 32, 4)}"),
                     f.let(f"shl <32 x i8> {qh}, {splat_const('i8', 32, 2)}"),
                     qh,
                     f.let(f"lshr <32 x i8> {qh}, {splat_const('i8', 32, 2)}")]
            qh_bits = [f.let(f"and <32 x i8> {v}, {hi2}") for v in moved]
            nib = [f.let(f"and <32 x i8> {qa}, {low4}"), f.let(f"and <32 x i8> {qb}, {low4}"),
                   f.let(f"lshr <32 x i8> {qa}, {splat_const('i8', 32, 4)}"),
                   f.let(f"lshr <32 x i8> {qb}, {splat_const('i8', 32, 4)}")]
            for v in range(4):
                q = f.let(f"or <32 x i8> {nib[v]}, {qh_bits[v]}")
                g = 8 * h + 2 * v
                scale = f.let(f"shufflevector <16 x i16> {sc16}, <16 x i16> poison, {shuffle_mask([g] * 8 + [g + 1] * 8)}")
                for t, x in enumerate(xs):
                    isums.add(t, ops.maddubs(q, f.load("<32 x i8>", x, 4 + 128 * h + 32 * v)), scale)
        return _minus_offset(f, ops, xs, isums, sc16, d, 5)

    return block


def fold(f: KernelFn, terms: Terms, acc: str) -> str:
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


def fold_whole(f: KernelFn, terms: Terms, acc: str) -> str:
    """Fold one block's terms whole (Q4_K/Q5_K: (isum, d*dx), (minsum, -dmin*dx); Q6_K: the
    first alone): lane 0 of the accumulator gathers fma(float(sum of isum's lanes), d*dx, .),
    lane 1 the mins' likewise (the other lanes stay 0, so the final hsum_halves is lane 0 +
    lane 1). The integer lane sums are exact, so this is the arithmetic of gemm's interleaved
    K-quant kernels, and of llama.cpp's repacked Q4_K (acc - acc_min), bit for bit."""
    values, scales = "zeroinitializer", "zeroinitializer"
    for lane, t in enumerate(terms):
        total = f.let(f"call i32 @llvm.vector.reduce.add.v8i32(<8 x i32> {t.value})")
        values = f.let(f"insertelement <8 x i32> {values}, i32 {total}, i64 {lane}")
        scale = f.let(f"extractelement <8 x float> {t.scale}, i64 0")
        scales = f.let(f"insertelement <8 x float> {scales}, float {scale}, i64 {lane}")
    fs = f.let(f"sitofp <8 x i32> {values} to <8 x float>")
    return f.let(f"call <8 x float> @llvm.fma.v8f32(<8 x float> {fs}, <8 x float> {scales}, <8 x float> {acc})")


def super_block_tiles(body: Body, f: KernelFn, ops: IntOps, whole: bool = False) -> RowCallbacks:
    """emit_rows' callbacks for a super-block body against q8_k rows: per tile row one
    <8 x float> accumulator; a block's terms are summed (fold; `whole`: fold_whole, block by
    block in order), then hsum at the end."""

    def k_block(wbs: list[str], xss: list[list[str]], row_accs: list[list[str]]) -> list[list[str]]:
        per_block = [body(f, ops, wb, [xs[g] for xs in xss]) for g, wb in enumerate(wbs)]
        if whole:
            out = []
            for t, acc in enumerate(row_accs):
                a = acc[0]
                for terms in per_block:
                    a = fold_whole(f, terms[t], a)
                out.append([a])
            return out
        return [[fold(f, [term for terms in per_block for term in terms[t]], acc[0])]
                for t, acc in enumerate(row_accs)]

    x_block_bytes = ACTIVATION_LAYOUTS["q8_k"].itemsize  # q8_k: ggml's blocks, row by row
    accs, block, finish = row_tiles(
        f, x_base="%xq", x_row_bytes=f.mul("%nb", x_block_bytes), x_block_bytes=x_block_bytes,
        acc_types=(V8F,), block=k_block, finish=lambda row_accs, _w, _x: f.hsum_halves(row_accs[0]))
    return RowCallbacks(accs, block, finish)


def q2_k_tiles(t: QuantType, f: KernelFn, ops: IntOps, tiles: tuple[int, ...],
               wide: bool) -> RowCallbacks:
    return super_block_tiles(q2_k_body(t), f, ops)


def q3_k_tiles(t: QuantType, f: KernelFn, ops: IntOps, tiles: tuple[int, ...],
               wide: bool) -> RowCallbacks:
    return super_block_tiles(q3_k_body(t), f, ops)


def q4_5_k_tiles(t: QuantType, f: KernelFn, ops: IntOps, tiles: tuple[int, ...],
                 wide: bool) -> RowCallbacks:
    return super_block_tiles(q4_5_k_body(t), f, ops, whole=True)


def q6_k_tiles(t: QuantType, f: KernelFn, ops: IntOps, tiles: tuple[int, ...],
               wide: bool) -> RowCallbacks:
    return super_block_tiles(q6_k_body(), f, ops, whole=True)
