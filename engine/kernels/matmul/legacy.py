"""The legacy types' tiles (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and IQ4_NL, MXFP4: 32-value blocks)
against packed q8_0 / q8_1 activations. IQ4_NL and MXFP4 are Q8_0 once their 4-bit indices are
looked up in their codebooks (one vpshufb), with q8_0 activations as llama.cpp pairs them;
MXFP4's block scale is an E8M0 byte (2^(e - 128), ggml's GGML_E8M0_TO_FP32_HALF) where the
others hold an f16 d, and its dot product is ggml_vec_dot_mxfp4_q8_0's, IQ4_NL's loop.

Legacy types accumulate in llama.cpp's order (ggml_vec_dot_q4_1_q8_1 and friends on x86):
per block one FMA into a single <8 x float> accumulator, the block-offset products summed
into a scalar, then hsum(acc) + offsets. So our dot products are llama.cpp's, bit for bit for
Q4_1/Q5_1/Q8_0 (Q4_0/Q5_0 take q8_1 activations here, see engine/formats/quants.py). The facts of each
type (field offsets, zero point, activation format) come from its record, engine.formats.quants.TYPES.
"""
from __future__ import annotations

from engine.formats.quant_mx import SCALE_E8M0_HALF
from engine.formats.quants import QuantType
from engine.kernels.ir.consts import V8F, shuffle_mask
from engine.kernels.ir.intdot import IntOps
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.matmul.loops import Tile
from engine.kernels.matmul.quantizer import Packed

# Tiles of at least this many rows compute a weight row's block scales in a pass of their own
# (see LegacyTiles); smaller ones inline them (a pass costs more than it saves for one row).
SCALE_BUFFER_ROWS = 4


def e8m0_half(f: KernelFn, base: str, offset: int | str) -> str:
    """The float 2^(e - 128) of the E8M0 byte at base + offset: (e - 1) << 23 as float bits, and
    for e < 2 the subnormals 0x00200000 << e, as ggml's GGML_E8M0_TO_FP32_HALF."""
    e = f.let(f"zext i8 {f.load('i8', base, offset)} to i32")
    small = f.let(f"icmp ult i32 {e}, 2")
    subnormal = f.let(f"shl i32 2097152, {e}")
    normal = f.let(f"shl i32 {f.let(f'sub i32 {e}, 1')}, 23")
    return f.let(f"bitcast i32 {f.let(f'select i1 {small}, i32 {subnormal}, i32 {normal}')} to float")


class LegacyTiles:
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL against packed q8_0 / q8_1 activations: the
    callbacks of emit_rows.

    Weight block: f16 d [| f16 m] [| u32 qh] | qs. Activations (Packed): y, a row's block of 32
    i8 values, rows in pairs; its scale dx and, for q8_1, s = dx * sum(y), 8 rows side by side.
    q = nibbles (values 0..15 from the low then the high nibbles of qs), | bit j of qh << 4 (Q5),
    or the i8 qs (Q8_0), or the codebook values of the nibbles (IQ4_NL). isum = sum(q * y) per
    4-lane group (dot_us); the 4- and 5-bit types take q unsigned (maddubs needs one unsigned
    operand) and add the offset through s; Q8_0 and IQ4_NL are signed
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

    def __init__(self, t: QuantType, f: KernelFn, ops: IntOps, max_rows: int, wide: bool) -> None:
        assert t.act in ("q8_0", "q8_1"), t.name
        self.t, self.f, self.ops = t, f, ops
        self.w_block_bytes = t.block_bytes
        self.wide = wide
        self.signed = t.act == "q8_0"  # Q8_0: signed i8 quants, no offset; others unsigned + s
        self.offsets = not self.signed
        self.qs_at = t.offset("qs")
        self.qh_at = t.offset("qh") if t.has("qh") else None
        self.packed = Packed(f, t.act)
        self.block_scale = e8m0_half if t.scale == SCALE_E8M0_HALF else KernelFn.f16_scalar
        self.scales = f.let(f"alloca float, i64 {f.mul('%nb', max_rows)}, align 32")  # [nb, rows]

    def _pairs(self, rows: int) -> int:
        return rows // 2 if self.wide else 0

    def accs(self, rows: int) -> list[tuple[str, str]]:
        pairs = self._pairs(rows)
        values = [("<16 x float>", "zeroinitializer")] * pairs + [(V8F, "zeroinitializer")] * (rows - 2 * pairs)
        return values + [(f"<{rows} x float>", "zeroinitializer")] if self.offsets else values

    def prologue(self, w_row: str, tile: Tile) -> None:
        f, n = self.f, tile.rows
        vn = f"<{n} x float>"
        if n < SCALE_BUFFER_ROWS:
            return

        def per_block(b: str, _: list[str]) -> list[str]:
            d = self.block_scale(f, w_row, f.mul(b, self.w_block_bytes))
            dx = f.load(vn, self.packed.scale(tile.m0, b, 0), 0, 4)
            f.store(vn, f.let(f"fmul {vn} {f.splat_float(d, n)}, {dx}"), self.scales, f.mul(b, 4 * n), 4)
            return []

        f.loop("%nb", [], per_block)

    def block(self, wbs: list[str], idx: list[str], tile: Tile, values: list[str]) -> list[str]:
        f, ops, qt = self.f, self.ops, self.t
        out = list(values)
        n = tile.rows
        pairs = self._pairs(n)
        vn = f"<{n} x float>"
        for w, b in zip(wbs, idx):
            if self.signed:
                if qt.codebook is None:  # Q8_0: the i8 quants themselves
                    raw = f.load("<32 x i8>", w, self.qs_at)
                else:  # IQ4_NL: 4-bit indices into the codebook
                    raw = ops.lookup(f.nibbles32(w, self.qs_at), qt.codebook)
                prepared = ops.signed(raw)
                wide = ops.signed_wide(raw) if pairs else None
            else:
                q = f.nibbles32(w, self.qs_at)
                if self.qh_at is not None:
                    q = f.let(f"or <32 x i8> {q}, {f.bits32(f.load('i32', w, self.qh_at), 16)}")
                if pairs:  # the block for both rows of a pair
                    q2 = f.let(f"shufflevector <32 x i8> {q}, <32 x i8> poison, {shuffle_mask(list(range(32)) * 2)}")
                if qt.has("m"):  # Q4_1/Q5_1: f16 d | f16 m, converted together
                    dm = f.let(f"fpext <2 x half> {f.load('<2 x half>', w, 0)} to <2 x float>")
                    d = f.let(f"extractelement <2 x float> {dm}, i64 0")
                    m = f.let(f"extractelement <2 x float> {dm}, i64 1")
                else:  # -8d or -16d: exact, a power of two
                    d = f.f16_scalar(w, 0)
                    m = f.let(f"fmul float {d}, {float(qt.zero):.1f}")
                s = f.load(vn, self.packed.scale(tile.m0, b, 1), 0, 4)
                out[n - pairs] = f.fma(n, f.splat_float(m, n), s, out[n - pairs])
            scale_row = f.gep(self.scales, f.mul(b, 4 * n))
            if n < SCALE_BUFFER_ROWS:  # few rows: the scales in a register, splat by shuffles
                if self.signed:
                    d = self.block_scale(f, w, 0)
                dx = f.load(vn, self.packed.scale(tile.m0, b, 0), 0, 4)
                scales = f.let(f"fmul {vn} {f.splat_float(d, n)}, {dx}")
            else:
                scales = f.load(vn, scale_row, 0, 4)

            def splat(lanes: list[int], scales: str = scales, scale_row: str = scale_row) -> str:
                if n < SCALE_BUFFER_ROWS or len(lanes) > 8:
                    return f.let(f"shufflevector {vn} {scales}, {vn} poison, {shuffle_mask(lanes)}")
                return f.splat_float(f.load("float", scale_row, 4 * lanes[0], 4))  # a broadcast load

            for p in range(pairs):
                y = f.load("<64 x i8>", self.packed.qs(f.add(tile.m0, 2 * p), b))
                isum = ops.dot_ss_wide(wide, y) if self.signed and wide else ops.dot_us_wide(q2, y)
                fs = f.let(f"sitofp <16 x i32> {isum} to <16 x float>")
                out[p] = f.fma(16, splat([2 * p] * 8 + [2 * p + 1] * 8), fs, out[p])
            for t in range(2 * pairs, n):
                y = f.load("<32 x i8>", self.packed.qs(f.add(tile.m0, t), b))
                isum = ops.dot_ss(prepared, y) if self.signed else ops.dot_us(q, y)
                fs = f.let(f"sitofp <8 x i32> {isum} to <8 x float>")
                out[t - pairs] = f.fma(8, splat([t] * 8), fs, out[t - pairs])
        return out

    def finish(self, _w: str, tile: Tile, values: list[str]) -> list[str]:
        f, n = self.f, tile.rows
        pairs = self._pairs(n)
        row_accs = []
        for p in range(pairs):
            for h in range(2):
                row_accs.append(f.let(f"shufflevector <16 x float> {values[p]}, <16 x float> poison, "
                                      f"{shuffle_mask(range(8 * h, 8 * h + 8))}"))
        row_accs += values[pairs:pairs + n - 2 * pairs]
        results = []
        for t in range(n):
            total = f.hsum_halves(row_accs[t])
            if self.offsets:
                off = f.let(f"extractelement <{n} x float> {values[n - pairs]}, i64 {t}")
                total = f.let(f"fadd float {total}, {off}")
            results.append(total)
        return results

