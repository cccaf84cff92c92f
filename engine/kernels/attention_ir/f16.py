"""f16 in the attention kernels: rows of the f16 KV cache loaded as floats, and floats rounded
to f16 as the kernels' f16 operands and accumulator are (with F16C, or portably).
"""
from __future__ import annotations

from llvmlite import ir

from engine.kernels.ir.builder import (
    F32,
    I16,
    I32,
    VEC,
    const,
    gep,
)


def load_half(b: ir.IRBuilder, base: ir.Value, index: ir.Value, f16c: bool,
              lanes: int = VEC) -> ir.Value:
    """`lanes` f16 values (stored as i16) at base[index] as <lanes x float>."""
    vi16, vi32, vf32 = (ir.VectorType(t, lanes) for t in (I16, I32, F32))
    ptr = b.bitcast(gep(b, base, index), vi16.as_pointer())
    bits = b.load(ptr, align=2)
    if f16c:  # vcvtph2ps
        return b.fpext(b.bitcast(bits, ir.VectorType(ir.HalfType(), lanes)), vf32)
    # Portable: put exponent+mantissa where float keeps them and rebias by 2^(127-15). The
    # multiply also turns f16 subnormals (f32 denormals here) into the right normal floats.
    h = b.zext(bits, vi32)
    sign = b.shl(b.and_(h, const(vi32, 0x8000)), const(vi32, 16))
    em = b.and_(h, const(vi32, 0x7FFF))
    shifted = b.shl(em, const(vi32, 13))
    finite = b.bitcast(b.fmul(b.bitcast(shifted, vf32), const(vf32, 2.0 ** 112)), vi32)
    special = b.or_(shifted, const(vi32, 0x7F800000))  # inf / nan keep their mantissa
    mag = b.select(b.icmp_unsigned(">=", em, const(vi32, 0x7C00)), special, finite)
    return b.bitcast(b.or_(mag, sign), vf32)


def round_half(b: ir.IRBuilder, x: ir.Value, f16c: bool) -> ir.Value:
    """A float vector rounded to the nearest f16 values (kept as float), as storing to f16 would.

    With F16C: vcvtps2ph + vcvtph2ps. Portable: Veltkamp's split keeps the top 11 significant
    bits (round to nearest), which is f16's precision for normal f16 values; f16 subnormals and
    overflow are not modelled there (attention accumulators stay far from both).
    """
    ty = x.type
    if f16c:
        return b.fpext(b.fptrunc(x, ir.VectorType(ir.HalfType(), ty.count)), ty)
    t = b.fmul(x, const(ty, float(2 ** 13 + 1)))
    r = b.fsub(t, b.fsub(t, x))
    return b.select(b.fcmp_ordered("ord", r, r), r, x)  # inf stays inf (the split gives NaN)
