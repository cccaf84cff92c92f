"""attention_exact and attention_rounded: three passes over the keys with an f32 softmax
(llama.cpp's tiled flash-attention path; rounded: its path without flash attention).
"""
from __future__ import annotations

import math

from llvmlite import ir

from engine.kernels.attention_ir.f16 import load_half, round_half
from engine.kernels.attention_ir.facts import FUNCTION_EXACT, FUNCTION_ROUNDED, ROWS
from engine.kernels.attention_ir.items import define, head_sink, item, runs_of_heads
from engine.kernels.attention_ir.scores import capped, dot_scores
from engine.kernels.ir import builder
from engine.kernels.ir.builder import (
    F32,
    I32,
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

V8I32 = ir.VectorType(I32, VEC)
V4F32 = ir.VectorType(F32, 4)


def define_exact(module: ir.Module, f16c: bool, registers: int, rounded: bool = False,
                  sinks: bool = False, bidirectional: bool = False) -> None:
    """attention_exact, or (rounded) attention_rounded: llama.cpp without flash attention,
    which takes q as f16 for q . k and the normalised probabilities as f16 for p . v. With
    sinks, ggml's soft_max with sinks: the max takes the sink in, the sum adds e^(sink - max)."""
    name = FUNCTION_ROUNDED if rounded else FUNCTION_EXACT
    b, args = define(module, name, "scores", sinks, bidirectional)  # scores: [run heads, round_up(n_keys, 8)]
    (q, k, v, out, scores, _n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end,
     window, ring, softcap) = args[:16]
    sink_logits = args[16] if sinks else None
    bi = (args[-2], args[-1]) if bidirectional else None
    row_stride = b.mul(n_kv_head, head_dim)
    group = b.sdiv(n_head, n_kv_head)

    def heads(w: ir.Value, n: int) -> None:
        """Items w .. w + n - 1 (one query, consecutive heads of one kv head): three passes over
        the keys, each head with its own scores row and exactly the operations it would see
        alone; key and value rows are converted from f16 once per pass for all n."""
        it = item(b, w, q, k, v, out, n_head, group, head_dim, pos0, window, ring, row_stride, bi)
        n_keys, n_keys_block, k_head, v_head = it.n_keys, it.n_keys_block, it.k_head, it.v_head
        off = [b.mul(b.add(w, i64(j)), head_dim) for j in range(n)]
        q_rows = [gep(b, q, o) for o in off]
        out_rows = [gep(b, out, o) for o in off]
        stride = builder.round_down(b, b.add(n_keys, i64(VEC - 1)), VEC)  # whole vectors
        score_rows = [gep(b, scores, b.mul(i64(j), stride)) for j in range(n)]

        if rounded:  # q16 in the output rows (free until pass 3; they may be the q rows)
            with counted_loop(b, i64(0), head_dim, VEC, "qr") as c:
                for j in range(n):
                    store(b, round_half(b, load(b, q_rows[j], c, V8F32), f16c), out_rows[j], c)
            q_rows = out_rows

        # -- pass 1: scores and their max ------------------------------------------------
        max4 = [variable(b, V4F32, const(V4F32, -math.inf), f"max4_{j}") for j in range(n)]
        with counted_loop(b, i64(0), n_keys_block, ROWS, "t") as t:
            rows = [it.row(b, k_head, b.add(t, i64(r))) for r in range(ROWS)]
            for j, s4 in enumerate(dot_scores(b, q_rows, rows, head_dim, scale, None, f16c, registers)):
                store(b, s4, score_rows[j], t)
                b.store(builder.maxnum(b, b.load(max4[j]), s4), max4[j])
        max1 = [variable(b, F32, const(F32, -math.inf), f"max1_{j}") for j in range(n)]
        with counted_loop(b, n_keys_block, n_keys, 1, "tt") as t:
            for j, s1 in enumerate(dot_scores(b, q_rows, [it.row(b, k_head, t)], head_dim, scale, None, f16c,
                                                 registers)):
                store(b, s1, score_rows[j], t)
                b.store(builder.maxnum(b, b.load(max1[j]), s1), max1[j])
        mx1 = [builder.maxnum(b, builder.hmax(b, b.load(max4[j])), b.load(max1[j])) for j in range(n)]
        # the softcap as a pass of its own (not a branch in the key loop): it is monotonic, so
        # the capped scores' max is the capped max
        pre_cap = b.block
        with b.if_then(b.fcmp_ordered(">", softcap, const(F32, 0.0)), likely=False):
            for j in range(n):
                with counted_loop(b, i64(0), n_keys, VEC, "cap") as t:  # scratch is whole vectors
                    store(b, capped(b, load(b, score_rows[j], t, V8F32), softcap), score_rows[j], t)
            capped_mx = [capped(b, m, softcap) for m in mx1]
            cap_block = b.block
        phis = [b.phi(F32) for _ in range(n)]  # (all phis first: they head their block)
        for j, phi in enumerate(phis):
            phi.add_incoming(mx1[j], pre_cap)
            phi.add_incoming(capped_mx[j], cap_block)
        sink = [head_sink(b, sink_logits, w, j, n_head) for j in range(n)]
        mx_s = [phi if sj is None else builder.maxnum(b, phi, sj) for phi, sj in zip(phis, sink)]
        mx = [builder.splat(b, m) for m in mx_s]

        # -- pass 2: p = exp(s - max) in place, l = sum p ---------------------------------
        keys = builder.splat(b, b.trunc(n_keys, I32))
        inv_l = []
        for j in range(n):
            total = variable(b, V8F32, const(V8F32, 0.0), f"total{j}")
            with counted_loop(b, i64(0), n_keys, VEC, "e") as t:
                lane = b.add(builder.splat(b, b.trunc(t, I32)), ir.Constant(V8I32, list(range(VEC))))
                p = builder.exp(b, b.fsub(load(b, score_rows[j], t, V8F32), mx[j]))
                p = b.select(b.icmp_signed("<", lane, keys), p, const(V8F32, 0.0))  # lanes past the last key
                store(b, p, score_rows[j], t)
                b.store(b.fadd(b.load(total), p), total)
            l_sum = builder.hsum(b, b.load(total))
            if sink[j] is not None:
                l_sum = b.fadd(l_sum, builder.exp(b, b.fsub(sink[j], mx_s[j])))
            inv_l.append(builder.splat(b, b.fdiv(const(F32, 1.0), l_sum)))

        def prob(j: int, t: ir.Value) -> ir.Value:
            """Head j's p[t] splat, as pass 3 multiplies it into v (rounded: f16(p[t] / l))."""
            p = builder.splat(b, load(b, score_rows[j], t))
            return round_half(b, b.fmul(p, inv_l[j]), f16c) if rounded else p

        def accumulate(t: ir.Value, count: int) -> None:
            """out_j += p_j[t + r] * v[t + r] for r < count, per head in the order it sees alone."""
            ps = [[prob(j, b.add(t, i64(r))) for r in range(count)] for j in range(n)]
            rows = [it.row(b, v_head, b.add(t, i64(r))) for r in range(count)]
            with counted_loop(b, i64(0), head_dim, VEC, "cv") as c:
                vs = [load_half(b, row, c, f16c) for row in rows]
                for j in range(n):
                    o = load(b, out_rows[j], c, V8F32)
                    for r in range(count):
                        o = fmuladd(b, ps[j][r], vs[r], o)
                    store(b, o, out_rows[j], c)

        # -- pass 3: out = sum p v / l ----------------------------------------------------
        with counted_loop(b, i64(0), head_dim, VEC, "z") as c:
            for j in range(n):
                store(b, const(V8F32, 0.0), out_rows[j], c)
        with counted_loop(b, i64(0), n_keys_block, ROWS, "u") as t:
            accumulate(t, ROWS)
        with counted_loop(b, n_keys_block, n_keys, 1, "ut") as t:
            accumulate(t, 1)
        if not rounded:
            with counted_loop(b, i64(0), head_dim, VEC, "n") as c:
                for j in range(n):
                    store(b, b.fmul(load(b, out_rows[j], c, V8F32), inv_l[j]), out_rows[j], c)

    runs_of_heads(b, w_begin, w_end, n_head, group, heads)
