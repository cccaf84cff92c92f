"""attention_<k>_<v>: attention that reads q8_0 / q4_0 KV rows directly, as llama.cpp's CPU flash
attention's one-row path does for a quantized cache (engine.kernels.attention_quantized_reference
is its twin and says what it computes). Per (query, head) item:

    qq, dq = q8_0(q row)                      into scratch: the quants as floats, the f16 scales
    for each key t:  s = scale * sum_blocks d_k * d_q * (qq . k quants)   (integer-valued sums:
                     exact in float, |sum| <= 32 * 127 * 127)
                     online softmax (selects, no branch); acc = acc * ms + vs * d_v * v quants
    out = acc * (1 / l)

One item at a time, 8 lanes (head_dim a multiple of 32). Rows: [n_ctx, n_kv_head, row_bytes].
"""
from __future__ import annotations

import math

from llvmlite import ir

from engine.kernels.ir import builder
from engine.kernels.ir.builder import (
    F32,
    F32P,
    I64,
    V8F32,
    VEC,
    const,
    counted_loop,
    fmuladd,
    gep,
    i64,
    load,
    store,
    variable,
)

I8 = ir.IntType(8)
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}
V8I8 = ir.VectorType(I8, VEC)
HALF = ir.HalfType()


def function_name(type_k: str, type_v: str) -> str:
    return f"attention_{type_k}_{type_v}"


def scratch_floats(head_dim: int) -> int:
    """Per thread: the query's quants and its accumulator (head_dim each), its block scales."""
    return 2 * head_dim + head_dim // 32


def _scale(b: ir.IRBuilder, block: ir.Value) -> ir.Value:
    """A block's f16 scale (its first two bytes) as a float."""
    return b.fpext(b.load(b.bitcast(block, HALF.as_pointer()), align=1), F32)


def _quants(b: ir.IRBuilder, block: ir.Value, i: int, qtype: str) -> ir.Value:
    """Values 8i .. 8i + 7 of a block's quants as <8 x float> (q4_0's with its -8)."""
    if qtype == "q8_0":
        raw = b.load(b.bitcast(gep(b, block, i64(2 + 8 * i)), V8I8.as_pointer()), align=1)
        return b.sitofp(raw, V8F32)
    raw = b.load(b.bitcast(gep(b, block, i64(2 + 8 * (i % 2))), V8I8.as_pointer()), align=1)
    nib = b.and_(raw, const(V8I8, 15)) if i < 2 else b.lshr(raw, const(V8I8, 4))
    return b.fsub(b.uitofp(nib, V8F32), const(V8F32, 8.0))


def define_quantized(module: ir.Module, type_k: str, type_v: str) -> None:
    """void f(q, k, v, out, scratch, n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin,
    w_end, window, ring): the f16 functions' signature (engine.kernels.attention_ir.items) with
    k and v byte pointers to ggml-block rows."""
    i8p = I8.as_pointer()
    b, args = builder.define(module, function_name(type_k, type_v), ir.VoidType(), [
        ("q", F32P), ("k", i8p), ("v", i8p), ("out", F32P), ("scratch", F32P),
        ("n_q", I64), ("n_head", I64), ("n_kv_head", I64), ("head_dim", I64), ("pos0", I64),
        ("scale", F32), ("w_begin", I64), ("w_end", I64), ("window", I64), ("ring", I64)])
    q, k, v, out, scratch, _n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end, \
        window, ring = args
    nb = b.sdiv(head_dim, i64(32))
    bk, bv = i64(BLOCK_BYTES[type_k]), i64(BLOCK_BYTES[type_v])
    k_stride, v_stride = b.mul(b.mul(n_kv_head, nb), bk), b.mul(b.mul(n_kv_head, nb), bv)
    group = b.sdiv(n_head, n_kv_head)
    qq, acc, dq = scratch, gep(b, scratch, head_dim), gep(b, scratch, b.mul(head_dim, i64(2)))
    m_var = variable(b, F32, const(F32, -math.inf), "m")
    l_var = variable(b, F32, const(F32, 0.0), "l")
    s_var = variable(b, V8F32, const(V8F32, 0.0), "s")

    with counted_loop(b, w_begin, w_end, 1, "w") as w:
        query, head = b.sdiv(w, n_head), b.srem(w, n_head)
        kv_head = b.sdiv(head, group)
        n_all = b.add(b.add(pos0, query), i64(1))
        clipped = b.and_(b.icmp_signed(">", window, i64(0)), b.icmp_signed(">", n_all, window))
        n_keys = b.select(clipped, window, n_all)
        first = b.urem(b.sub(n_all, n_keys), ring)   # consecutive rows after it (engine.kv's mirror)
        k_head = gep(b, k, b.add(b.mul(first, k_stride), b.mul(b.mul(kv_head, nb), bk)))
        v_head = gep(b, v, b.add(b.mul(first, v_stride), b.mul(b.mul(kv_head, nb), bv)))
        q_row, out_row = gep(b, q, b.mul(w, head_dim)), gep(b, out, b.mul(w, head_dim))

        # the query to q8_0: d = max|x| / 127, quants rint(x * 127 / max|x|) (0 for a zero block)
        with counted_loop(b, i64(0), nb, 1, "qb") as blk:
            xs = [load(b, q_row, b.add(b.mul(blk, i64(32)), i64(8 * i)), V8F32) for i in range(4)]
            mags = [builder.maxnum(b, x, b.fsub(const(V8F32, 0.0), x)) for x in xs]
            amax = builder.hmax(b, builder.maxnum(b, builder.maxnum(b, mags[0], mags[1]),
                                                  builder.maxnum(b, mags[2], mags[3])))
            nonzero = b.fcmp_ordered("!=", amax, const(F32, 0.0))
            inv = b.select(nonzero, b.fdiv(const(F32, 127.0), amax), const(F32, 0.0))
            rint = builder.intrinsic(b, "llvm.rint", V8F32, 1)
            for i, x in enumerate(xs):
                store(b, b.call(rint, [b.fmul(x, builder.splat(b, inv))]), qq,
                      b.add(b.mul(blk, i64(32)), i64(8 * i)))
            d = b.fdiv(amax, const(F32, 127.0))
            store(b, b.fpext(b.fptrunc(d, HALF), F32), dq, blk)
        with counted_loop(b, i64(0), head_dim, VEC, "z") as c:
            store(b, const(V8F32, 0.0), acc, c)
        b.store(const(F32, -math.inf), m_var)
        b.store(const(F32, 0.0), l_var)

        with counted_loop(b, i64(0), n_keys, 1, "t") as t:
            k_row = gep(b, k_head, b.mul(t, k_stride))
            v_row = gep(b, v_head, b.mul(t, v_stride))
            b.store(const(V8F32, 0.0), s_var)
            with counted_loop(b, i64(0), nb, 1, "kb") as blk:
                block = gep(b, k_row, b.mul(blk, bk))
                dot = const(V8F32, 0.0)
                for i in range(4):
                    qv = load(b, qq, b.add(b.mul(blk, i64(32)), i64(8 * i)), V8F32)
                    dot = fmuladd(b, qv, _quants(b, block, i, type_k), dot)
                dd = b.fmul(_scale(b, block), load(b, dq, blk))
                b.store(fmuladd(b, builder.splat(b, dd), dot, b.load(s_var)), s_var)
            s = b.fmul(builder.hsum(b, b.load(s_var)), scale)
            m = b.load(m_var)
            new_max = b.fcmp_ordered(">", s, m)
            e = builder.exp(b, b.select(new_max, b.fsub(m, s), b.fsub(s, m)))
            ms = b.select(new_max, e, const(F32, 1.0))
            vs = b.select(new_max, const(F32, 1.0), e)
            b.store(b.select(new_max, s, m), m_var)
            b.store(fmuladd(b, b.load(l_var), ms, vs), l_var)
            msv, vsv = builder.splat(b, ms), builder.splat(b, vs)
            with counted_loop(b, i64(0), nb, 1, "vb") as blk:
                block = gep(b, v_row, b.mul(blk, bv))
                dv = builder.splat(b, _scale(b, block))
                for i in range(4):
                    at = b.add(b.mul(blk, i64(32)), i64(8 * i))
                    value = b.fmul(dv, _quants(b, block, i, type_v))
                    store(b, fmuladd(b, value, vsv, b.fmul(load(b, acc, at, V8F32), msv)), acc, at)
        inv_l = builder.splat(b, b.fdiv(const(F32, 1.0), b.load(l_var)))
        with counted_loop(b, i64(0), head_dim, VEC, "o") as c:
            store(b, b.fmul(load(b, acc, c, V8F32), inv_l), out_row, c)
    b.ret_void()


def build_quantized_module(type_k: str, type_v: str) -> ir.Module:
    module = builder.new_module(f"attention_{type_k}_{type_v}")
    define_quantized(module, type_k, type_v)
    return module
