"""attention_f16acc: one online-softmax pass over the keys, BLOCK_KEYS at a time, with an f16
accumulator (llama.cpp's one-query-row flash-attention path).
"""
from __future__ import annotations

import math

from llvmlite import ir

from engine.kernels.attention_ir.f16 import load_half, round_half
from engine.kernels.attention_ir.facts import (
    BLOCK_KEYS,
    FUNCTION_F16ACC,
    PREFETCH_KEYS,
    ROWS,
    SOFTMAX_LANES,
)
from engine.kernels.attention_ir.items import define, head_sink, item, min_i64, runs_of_heads
from engine.kernels.attention_ir.scores import dot_scores
from engine.kernels.ir import builder
from engine.kernels.ir.builder import (
    F32,
    I32,
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


def define_f16acc(module: ir.Module, f16c: bool, registers: int, sinks: bool = False,
                  bidirectional: bool = False) -> None:
    b, args = define(module, FUNCTION_F16ACC, "scratch", sinks, bidirectional)  # see f16acc_scratch_floats
    (q, k, v, out, scratch, _n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end,
     window, ring, softcap) = args[:16]
    sink_logits = args[16] if sinks else None
    bi = (args[-2], args[-1]) if bidirectional else None
    row_stride = b.mul(n_kv_head, head_dim)
    group = b.sdiv(n_head, n_kv_head)
    wide = b.icmp_signed("==", b.and_(head_dim, i64(2 * VEC - 1)), i64(0))  # 16-lane passes fit

    def heads(w: ir.Value, n: int) -> None:
        """Items w .. w + n - 1 (one query, consecutive heads of one kv head) in one pass over
        the keys, BLOCK_KEYS at a time: each head keeps its own q16 row, running max and sum and
        f16 accumulator (its output row), with exactly the operations it would see alone; key
        and value rows are converted from f16 once for all n."""
        it = item(b, w, q, k, v, out, n_head, group, head_dim, pos0, window, ring, row_stride, bi)
        n_keys, k_head, v_head = it.n_keys, it.k_head, it.v_head
        off = [b.mul(b.add(w, i64(j)), head_dim) for j in range(n)]
        out_rows = [gep(b, out, o) for o in off]
        q16_rows = [gep(b, scratch, b.mul(i64(j), head_dim)) for j in range(n)]
        block_rows = gep(b, scratch, b.mul(i64(n), head_dim))  # then [3][n][BLOCK_KEYS]
        score_rows, ms_rows, vs_rows = ([gep(b, block_rows, i64((a * n + j) * BLOCK_KEYS)) for j in range(n)]
                                        for a in range(3))

        # q rounded to f16 once per item, as ggml converts Q for its f16 dot products
        with counted_loop(b, i64(0), head_dim, VEC, "qr") as c:
            for j in range(n):  # read q before zeroing out: they may be the same row
                store(b, round_half(b, load(b, gep(b, q, off[j]), c, V8F32), f16c), q16_rows[j], c)
                store(b, const(V8F32, 0.0), out_rows[j], c)
        m_run = [variable(b, F32, const(F32, -math.inf), f"m{j}") for j in range(n)]  # running max
        l_run = [variable(b, F32, const(F32, 0.0), f"l{j}") for j in range(n)]        # running sum

        def prefetch_rows(base: ir.Value, first: ir.Value, count: int) -> None:
            """Ask for rows first .. first + count - 1 of `base` (clamped to the last key) ahead
            of use: the cache rows are cold after the step's matmuls streamed the weights through."""
            for r in range(count):
                row = it.row(b, base, min_i64(b, b.add(first, i64(r)), b.sub(n_keys, i64(1))))
                with counted_loop(b, i64(0), head_dim, 32, "pfc") as c:  # 32 f16: one line
                    prefetch(b, gep(b, row, c))
                prefetch(b, gep(b, row, b.sub(head_dim, i64(1))))

        def blockdot_scores(t0: ir.Value, count: ir.Value) -> None:
            """score_rows[j][r] = scale * (q16_j . k[t0 + r]) for r < count (see _scores); the
            next block's key rows and this block's value rows are prefetched meanwhile."""
            count4 = builder.round_down(b, count, ROWS)
            with counted_loop(b, i64(0), count4, ROWS, "s4") as r:
                t = b.add(t0, r)
                prefetch_rows(k_head, b.add(t, i64(BLOCK_KEYS)), ROWS)
                prefetch_rows(v_head, t, ROWS)
                rows = [it.row(b, k_head, b.add(t, i64(i))) for i in range(ROWS)]
                for j, s4 in enumerate(dot_scores(b, q16_rows, rows, head_dim, scale, softcap, f16c, registers)):
                    store(b, s4, score_rows[j], r)
            with counted_loop(b, count4, count, 1, "s1") as r:
                rows = [it.row(b, k_head, b.add(t0, r))]
                for j, s1 in enumerate(dot_scores(b, q16_rows, rows, head_dim, scale, softcap, f16c, registers)):
                    store(b, s1, score_rows[j], r)

        def block_accumulate(t0: ir.Value, count: ir.Value, lanes: int, new_keys: ir.Value) -> None:
            """acc = f16(acc * ms) then acc = f16(acc + v * vs), key by key, for every head. The
            accumulators of `per_pass` vectors of head_dim stay in registers across the block's
            keys; the value rows are converted once. The rescale runs only for the keys with a
            bit in new_keys (a branch that rarely goes that way after the first keys): for the
            others every ms is 1 and f16(acc * 1) = acc. Elementwise, so the lane count changes
            no bit."""
            vty = ir.VectorType(F32, lanes)
            per_pass = vectors_per_pass(n, lanes, registers)

            def one_pass(c: ir.Value, u: int) -> None:
                accs = [[variable(b, vty, load(b, out_rows[j], b.add(c, i64(i * lanes)), vty), f"acc{j}_{i}")
                         for i in range(u)] for j in range(n)]
                with counted_loop(b, i64(0), count, 1, "ak") as r:
                    row = it.row(b, v_head, b.add(t0, r))
                    vals = [load_half(b, row, b.add(c, i64(i * lanes)), f16c, lanes) for i in range(u)]
                    is_new = b.trunc(b.lshr(new_keys, r), ir.IntType(1))
                    with b.if_then(is_new, likely=False):
                        for j in range(n):
                            msv = builder.splat(b, load(b, ms_rows[j], r), lanes)
                            for i in range(u):
                                b.store(round_half(b, b.fmul(b.load(accs[j][i]), msv), f16c), accs[j][i])
                    for j in range(n):
                        vsv = builder.splat(b, load(b, vs_rows[j], r), lanes)
                        for i in range(u):
                            acc = round_half(b, fmuladd(b, vals[i], vsv, b.load(accs[j][i])), f16c)
                            b.store(acc, accs[j][i])
                for j in range(n):
                    for i in range(u):
                        store(b, b.load(accs[j][i]), out_rows[j], b.add(c, i64(i * lanes)))

            whole = builder.round_down(b, head_dim, per_pass * lanes)
            with counted_loop(b, i64(0), whole, per_pass * lanes, "ap") as c:
                one_pass(c, per_pass)
            with counted_loop(b, whole, head_dim, lanes, "a1") as c:
                one_pass(c, 1)

        prefetch_rows(k_head, i64(0), PREFETCH_KEYS)
        with counted_loop(b, i64(0), n_keys, BLOCK_KEYS, "blk") as t0:
            count = min_i64(b, b.sub(n_keys, t0), i64(BLOCK_KEYS))
            blockdot_scores(t0, count)
            new_keys = block_softmax(b, n, count, score_rows, ms_rows, vs_rows, m_run, l_run)
            with b.if_else(wide) as (w16, w8):
                with w16:
                    block_accumulate(t0, count, 2 * VEC, new_keys)
                with w8:
                    block_accumulate(t0, count, VEC, new_keys)

        for j in range(n):  # l >= 1: the max key adds 1
            sink = head_sink(b, sink_logits, w, j, n_head)
            l_end, rescale = b.load(l_run[j]), None
            if sink is not None:  # ggml's sink step on the f32 accumulator: one more key, v = 0
                m = b.load(m_run[j])
                new_max = b.fcmp_ordered(">", sink, m)
                e = builder.exp(b, b.select(new_max, b.fsub(m, sink), b.fsub(sink, m)))
                one = const(F32, 1.0)
                ms = b.select(new_max, e, one)
                l_end = fmuladd(b, l_end, ms, b.select(new_max, one, e))
                rescale = builder.splat(b, ms)
            inv_l = builder.splat(b, b.fdiv(const(F32, 1.0), l_end))
            with counted_loop(b, i64(0), head_dim, VEC, "n") as c:
                o = load(b, out_rows[j], c, V8F32)
                if rescale is not None:
                    o = b.fmul(o, rescale)
                store(b, b.fmul(o, inv_l), out_rows[j], c)

    runs_of_heads(b, w_begin, w_end, n_head, group, heads)



def block_softmax(b: ir.IRBuilder, n: int, count: ir.Value, score_rows: list[ir.Value],
                  ms_rows: list[ir.Value], vs_rows: list[ir.Value], m_run: list[ir.Value],
                  l_run: list[ir.Value]) -> ir.Value:
    """Per head, each of the block's keys' accumulator factors in key order, as the
    sequential online softmax gives them: on a new max (s > the max before it)
    ms = e^(m_before - s) (the rescale) and vs = 1, else ms = 1 and vs = e^(s - m_before).
    m_before comes from a prefix max over the block's lanes (maxnum ignores NaN as the
    sequential compare does; +0 / -0 ties change no result), one exp for SOFTMAX_LANES
    keys. Then l = l * ms + vs key by key (the order the sum sees alone). Returns a mask
    whose bit r is set when key r set a new max for any head."""
    vty = ir.VectorType(F32, SOFTMAX_LANES)
    ity = ir.VectorType(I32, SOFTMAX_LANES)
    neg_inf, ones = const(vty, -math.inf), const(vty, 1.0)
    lanes = ir.Constant(ity, list(range(SOFTMAX_LANES)))
    last = builder.splat(b, b.trunc(count, I32), SOFTMAX_LANES)
    new_keys = variable(b, I64, i64(0), "new_keys")
    for j in range(n):
        with counted_loop(b, i64(0), count, SOFTMAX_LANES, "sm") as r:
            valid = b.icmp_signed("<", b.add(builder.splat(b, b.trunc(r, I32), SOFTMAX_LANES), lanes), last)
            s = b.select(valid, load(b, score_rows[j], r, vty), neg_inf)  # lanes past the block's keys
            upto = s  # upto[i] = max(s[0..i]): shift by 1, 2, 4, ... lanes (-inf in) and take the max
            shift = 1
            while shift < SOFTMAX_LANES:
                moved = builder.shuffle(b, neg_inf, upto, [SOFTMAX_LANES + i - shift if i >= shift else i
                                                           for i in range(SOFTMAX_LANES)])
                upto = builder.maxnum(b, upto, moved)
                shift *= 2
            m = b.load(m_run[j])
            earlier = builder.shuffle(b, neg_inf, upto, [SOFTMAX_LANES + i - 1 if i else 0
                                                         for i in range(SOFTMAX_LANES)])
            before = builder.maxnum(b, builder.splat(b, m, SOFTMAX_LANES), earlier)
            new_max = b.fcmp_ordered(">", s, before)
            e = builder.exp(b, b.select(new_max, b.fsub(before, s), b.fsub(s, before)))  # <= 0
            store(b, b.select(new_max, e, ones), ms_rows[j], r)
            store(b, b.select(new_max, ones, e), vs_rows[j], r)
            b.store(builder.maxnum(b, m, b.extract_element(upto, ir.Constant(I32, SOFTMAX_LANES - 1))), m_run[j])
            bits = b.shl(b.zext(b.bitcast(new_max, ir.IntType(SOFTMAX_LANES)), I64), r)
            b.store(b.or_(b.load(new_keys), bits), new_keys)
    with counted_loop(b, i64(0), count, 1, "sl") as r:  # the heads' sums: n chains side by side
        for j in range(n):
            b.store(fmuladd(b, b.load(l_run[j]), load(b, ms_rows[j], r), load(b, vs_rows[j], r)), l_run[j])
    return b.load(new_keys)


def prefetch(b: ir.IRBuilder, ptr: ir.Value) -> None:
    """A read prefetch into all cache levels (never faults, changes no result)."""
    i8p = ir.IntType(8).as_pointer()
    fn = b.module.globals.get("llvm.prefetch.p0")
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ir.VoidType(), [i8p, I32, I32, I32]), name="llvm.prefetch.p0")
    b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])



def vectors_per_pass(n: int, lanes: int, registers: int) -> int:
    """How many <lanes x float> vectors of head_dim one accumulation pass keeps per head: n heads'
    accumulators plus the converted value vectors within the vector registers, less two (the
    splat factors); a power of two (head_dims are), at most 4."""
    regs = max(1, lanes // (16 if registers >= 32 else 8))  # registers one vector takes (AVX-512: 16 floats)
    fit = max(1, (registers - 2) // ((n + 1) * regs))
    return min(4, 1 << (fit.bit_length() - 1))
