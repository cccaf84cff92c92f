"""The IQ4_XS tiles (super-blocks of 256 values, 4-bit codebook indices) against q8_k
activations, as llama.cpp pairs them. (IQ4_NL, blocks of 32, is a legacy tile: legacy.py.)

Per sub-block j of 32 values: q = codebook[nibbles of qs[16j:16j + 16]] (one vpshufb; values
-127..113, signed), isum += madd(dot_ss_pairs(q, y), splat(ls[j] - 32)), the sub-block scale
ls[j] = (scales_l[j // 2] >> 4 (j % 2) & 0xF) | (scales_h >> 2j & 3) << 4.
Term: d*dx * isum.
"""
from __future__ import annotations

from engine.formats.quants import QuantType
from engine.kernels.ir.consts import shuffle_mask, splat_const
from engine.kernels.ir.intdot import IntOps
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.matmul.kquants import Body, ISums, Term, Terms, super_block_tiles
from engine.kernels.matmul.loops import RowCallbacks


def iq4_xs_scales(f: KernelFn, w: str, t: QuantType) -> str:
    """The 8 sub-block scales ls - 32 of the block at w, as <8 x i16>."""
    low = f.load("<4 x i8>", w, t.offset("scales_l"))
    low = f.let(f"shufflevector <4 x i8> {low}, <4 x i8> poison, {shuffle_mask(j // 2 for j in range(8))}")
    low = f.field(low, 8, "i8", [4 * (j % 2) for j in range(8)], 15)
    low = f.let(f"zext <8 x i8> {low} to <8 x i16>")
    high = f.let(f"insertelement <8 x i16> poison, i16 {f.load('i16', w, t.offset('scales_h'))}, i64 0")
    high = f.let(f"shufflevector <8 x i16> {high}, <8 x i16> poison, <8 x i32> zeroinitializer")
    high = f.field(high, 8, "i16", range(0, 16, 2), 3)
    high = f.let(f"shl <8 x i16> {high}, {splat_const('i16', 8, 4)}")
    ls = f.let(f"or <8 x i16> {low}, {high}")
    return f.let(f"sub <8 x i16> {ls}, {splat_const('i16', 8, 32)}")


def iq4_xs_body(t: QuantType) -> Body:
    assert t.codebook is not None
    codebook, qs_at, d_at = t.codebook, t.offset("qs"), t.offset("d")

    def block(f: KernelFn, ops: IntOps, w: str, xs: list[str]) -> list[Terms]:
        d = f.f16_splat(w, d_at)
        ls = iq4_xs_scales(f, w, t)
        isums = ISums(f, ops, len(xs))
        for j in range(8):
            prepared = ops.signed(ops.lookup(f.nibbles32(w, qs_at + 16 * j), codebook))
            scale = f.let(f"shufflevector <8 x i16> {ls}, <8 x i16> poison, {shuffle_mask([j] * 16)}")
            for i, x in enumerate(xs):
                isums.add(i, ops.dot_ss_pairs(prepared, f.load("<32 x i8>", x, 4 + 32 * j)), scale)
        return [[Term(isums.total(i), f.let(f"fmul <8 x float> {d}, {f.f32_splat(x, 0)}"))]
                for i, x in enumerate(xs)]

    return block


def iq4_xs_tiles(t: QuantType, f: KernelFn, ops: IntOps, tiles: tuple[int, ...],
                 wide: bool) -> RowCallbacks:
    return super_block_tiles(iq4_xs_body(t), f, ops)
