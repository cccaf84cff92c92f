"""The attention kernels' LLVM IR (engine.kernels.attention has what they compute and why).

build_attention_module(f16c, registers) -> one module with attention_exact, attention_rounded
and attention_f16acc, same signature; the constants here are the facts the facade, the tasks and the
numpy twins (attention_reference.py) share.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from engine.kernels.ir import builder
from engine.kernels.ir.builder import (
    F32,
    F32P,
    I16,
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

V8I32 = ir.VectorType(I32, VEC)
V4F32 = ir.VectorType(F32, 4)
ROWS = 4  # key/value rows per step: 4 accumulators + q + conversions fit in 16 registers

FUNCTION_EXACT = "attention_exact"    # three passes, f32 softmax: llama.cpp's tiled path
FUNCTION_F16ACC = "attention_f16acc"  # online softmax, f16 accumulator: its one-row path
FUNCTION_ROUNDED = "attention_rounded"  # exact's passes with q and p rounded to f16: llama.cpp
#                                          without flash attention (every batch size)
# llama.cpp's CPU flash attention takes its tiled (f32) path once a batch has this many queries,
# and its one-query-row path (f16 accumulator) below; we follow the same switch.
TILED_MIN_QUERIES = 64
# attention_f16acc runs up to this many query heads of one kv head together (one pass over keys);
# 8 gained ~5% more on groups of 8 but tripled the module's compile time (0.4 -> 1.4 s)
GROUP_MAX = 4
BLOCK_KEYS = 32  # attention_f16acc's keys per block: their scores, softmax factors, accumulation
SOFTMAX_LANES = 16  # keys per vector of the block's softmax factors (one exp call)
PREFETCH_KEYS = 16  # key rows attention_f16acc prefetches before its first block


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


def _define(module: ir.Module, name: str, scratch: str,
            sinks: bool = False) -> tuple[ir.IRBuilder, list[ir.Value]]:
    """Both functions' signature; `scratch` names the per-thread scratch row; sinks adds a last
    argument, float* sinks [n_head]: each head's sink logit (gpt-oss)."""
    return builder.define(module, name, ir.VoidType(), [
        ("q", F32P),               # [n_q, n_head, head_dim]
        ("k", I16.as_pointer()),   # [n_ctx, n_kv_head, head_dim] f16 bits
        ("v", I16.as_pointer()),   # [n_ctx, n_kv_head, head_dim] f16 bits
        ("out", F32P),             # [n_q, n_head, head_dim]; may be q
        (scratch, F32P),           # this thread's scratch row (see build_attention_module)
        ("n_q", I64), ("n_head", I64), ("n_kv_head", I64), ("head_dim", I64), ("pos0", I64),
        ("scale", F32), ("w_begin", I64), ("w_end", I64),
        ("window", I64),           # keys a query sees, itself included (0: all before it)
        ("ring", I64),             # the key at position p is row p % ring (and, for p % ring <
        #                            window - 1, also row p % ring + ring: engine.kv's mirror)
        ("softcap", F32)]          # scores become softcap * tanh(s / softcap) (0: off)
        + ([("sinks", F32P)] if sinks else []))


def _sink(b: ir.IRBuilder, sinks: ir.Value | None, w: ir.Value, j: int,
          n_head: ir.Value) -> ir.Value | None:
    """Head j of the run starting at item w: its sink logit (None without sinks). A sink is one
    more logit in the softmax's denominator whose value row is 0 (llama.cpp's attn_sinks)."""
    if sinks is None:
        return None
    return load(b, sinks, b.add(b.srem(w, n_head), i64(j)))


@dataclass(frozen=True)
class _Item:
    """Where one (query, head) work item w = query * n_head + head reads and writes."""
    n_keys: ir.Value        # keys it sees: min(pos0 + query + 1, window)
    n_keys_block: ir.Value  # n_keys rounded down to ROWS
    q_row: ir.Value         # [head_dim] its query
    out_row: ir.Value       # [head_dim] its output
    k_head: ir.Value        # its kv head in its first key's row (row stride n_kv_head * head_dim):
    v_head: ir.Value        # cache row (pos0 + query + 1 - n_keys) % ring; and its first value
    row_stride: ir.Value

    def row(self, b: ir.IRBuilder, head: ir.Value, t: ir.Value) -> ir.Value:
        """Its t-th key's (or value's) row, t < n_keys: consecutive rows, also where a ring
        wraps, since a ring's first window - 1 rows are mirrored past its end (engine.kv)."""
        return gep(b, head, b.mul(t, self.row_stride))


def _item(b: ir.IRBuilder, w: ir.Value, q: ir.Value, k: ir.Value, v: ir.Value, out: ir.Value,
          n_head: ir.Value, group: ir.Value, head_dim: ir.Value, pos0: ir.Value,
          window: ir.Value, ring: ir.Value, row_stride: ir.Value) -> _Item:
    query = b.sdiv(w, n_head)
    kv_head = b.sdiv(b.srem(w, n_head), group)
    n_all = b.add(b.add(pos0, query), i64(1))  # keys up to and including its own position
    clipped = b.and_(b.icmp_signed(">", window, i64(0)), b.icmp_signed(">", n_all, window))
    n_keys = b.select(clipped, window, n_all)
    first = b.add(b.mul(b.urem(b.sub(n_all, n_keys), ring), row_stride), b.mul(kv_head, head_dim))
    return _Item(n_keys, builder.round_down(b, n_keys, ROWS), gep(b, q, b.mul(w, head_dim)),
                 gep(b, out, b.mul(w, head_dim)), gep(b, k, first), gep(b, v, first), row_stride)


def _define_exact(module: ir.Module, f16c: bool, registers: int, rounded: bool = False,
                  sinks: bool = False) -> None:
    """attention_exact, or (rounded) attention_rounded: llama.cpp without flash attention,
    which takes q as f16 for q . k and the normalised probabilities as f16 for p . v. With
    sinks, ggml's soft_max with sinks: the max takes the sink in, the sum adds e^(sink - max)."""
    name = FUNCTION_ROUNDED if rounded else FUNCTION_EXACT
    b, args = _define(module, name, "scores", sinks)  # scores: [run heads, round_up(n_keys, 8)]
    (q, k, v, out, scores, _n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end,
     window, ring, softcap) = args[:16]
    sink_logits = args[16] if sinks else None
    row_stride = b.mul(n_kv_head, head_dim)
    group = b.sdiv(n_head, n_kv_head)

    def heads(w: ir.Value, n: int) -> None:
        """Items w .. w + n - 1 (one query, consecutive heads of one kv head): three passes over
        the keys, each head with its own scores row and exactly the operations it would see
        alone; key and value rows are converted from f16 once per pass for all n."""
        it = _item(b, w, q, k, v, out, n_head, group, head_dim, pos0, window, ring, row_stride)
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
            for j, s4 in enumerate(_scores(b, q_rows, rows, head_dim, scale, None, f16c, registers)):
                store(b, s4, score_rows[j], t)
                b.store(builder.maxnum(b, b.load(max4[j]), s4), max4[j])
        max1 = [variable(b, F32, const(F32, -math.inf), f"max1_{j}") for j in range(n)]
        with counted_loop(b, n_keys_block, n_keys, 1, "tt") as t:
            for j, s1 in enumerate(_scores(b, q_rows, [it.row(b, k_head, t)], head_dim, scale, None, f16c,
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
                    store(b, _capped(b, load(b, score_rows[j], t, V8F32), softcap), score_rows[j], t)
            capped_mx = [_capped(b, m, softcap) for m in mx1]
            cap_block = b.block
        phis = [b.phi(F32) for _ in range(n)]  # (all phis first: they head their block)
        for j, phi in enumerate(phis):
            phi.add_incoming(mx1[j], pre_cap)
            phi.add_incoming(capped_mx[j], cap_block)
        sink = [_sink(b, sink_logits, w, j, n_head) for j in range(n)]
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

    _runs_of_heads(b, w_begin, w_end, n_head, group, heads)


def _runs_of_heads(b: ir.IRBuilder, w_begin: ir.Value, w_end: ir.Value, n_head: ir.Value,
                   group: ir.Value, heads: Callable[[ir.Value, int], None]) -> None:
    """Items w_begin <= w < w_end, taken in runs of up to GROUP_MAX consecutive heads of one kv
    head (a run ends where the group or the range does): heads(w, n) emits a run of n; then
    the function returns."""
    pre = b.block
    head_bb = b.append_basic_block("w.head")
    body_bb = b.append_basic_block("w.body")
    done_bb = b.append_basic_block("w.done")
    b.branch(head_bb)
    b.position_at_end(head_bb)
    w = b.phi(I64, name="w")
    w.add_incoming(w_begin, pre)
    b.cbranch(b.icmp_signed("<", w, w_end), body_bb, done_bb)
    b.position_at_end(body_bb)
    left_in_group = b.sub(group, b.srem(b.srem(w, n_head), group))
    n = _min(b, _min(b, left_in_group, b.sub(w_end, w)), i64(GROUP_MAX))
    next_bb = b.append_basic_block("w.next")
    cases = [b.append_basic_block(f"heads{g}") for g in range(1, GROUP_MAX + 1)]
    switch = b.switch(n, cases[0])
    for g, case in enumerate(cases, 1):
        switch.add_case(i64(g), case)
        b.position_at_end(case)
        heads(w, g)
        b.branch(next_bb)
    b.position_at_end(next_bb)
    w.add_incoming(b.add(w, n), next_bb)
    b.branch(head_bb)
    b.position_at_end(done_bb)
    b.ret_void()


def _keys_per_score_pass(n: int, registers: int) -> int:
    """Keys whose dot products share one pass over head_dim when n heads go together: each key
    takes a register for its converted row and one accumulator per head; stay within the
    vector registers, less one."""
    return next(kp for kp in (ROWS, 2, 1) if kp * (n + 1) + 1 <= registers - 1)


def _capped(b: ir.IRBuilder, s: ir.Value, cap: ir.Value) -> ir.Value:
    """cap * tanh(s / cap) (builder.tanh), for a float or a vector; cap is a float."""
    ty = s.type
    capv = builder.splat(b, cap, ty.count) if isinstance(ty, ir.VectorType) else cap
    return b.fmul(capv, builder.tanh(b, b.fdiv(s, capv)))


def _softcap(b: ir.IRBuilder, s: ir.Value, cap: ir.Value) -> ir.Value:
    """cap * tanh(s / cap) when cap > 0, else s (a branch on a per-call constant)."""
    ty = s.type
    pre = b.block
    with b.if_then(b.fcmp_ordered(">", cap, const(F32, 0.0))):
        capped = _capped(b, s, cap)
        then = b.block
    out = b.phi(ty)
    out.add_incoming(s, pre)
    out.add_incoming(capped, then)
    return out


def _scores(b: ir.IRBuilder, q_rows: list[ir.Value], k_rows: list[ir.Value], head_dim: ir.Value,
            scale: ir.Value, softcap: ir.Value | None, f16c: bool, registers: int) -> list[ir.Value]:
    """Per query row (head), scale * (q . k) for ROWS key rows (a <ROWS x float>) or one (a float).

    Per lane an fma chain over head_dim, then hsum4x8's or hsum's (equal) fixed tree: the same
    bits whichever keys and heads share a pass over head_dim. Each key row is converted from f16
    once per pass for all the heads.
    """
    n = len(q_rows)
    kp = min(_keys_per_score_pass(n, registers), len(k_rows))
    sums: list[list[ir.Value]] = [[] for _ in range(n)]  # [head][key] <8 x float> lane sums
    for r0 in range(0, len(k_rows), kp):
        accs = [[variable(b, V8F32, const(V8F32, 0.0), f"acc{j}_{r}") for r in range(kp)]
                for j in range(n)]
        with counted_loop(b, i64(0), head_dim, VEC, "c") as c:
            ks = [load_half(b, k_rows[r0 + r], c, f16c) for r in range(kp)]
            for j in range(n):
                qc = load(b, q_rows[j], c, V8F32)
                for r in range(kp):
                    b.store(fmuladd(b, qc, ks[r], b.load(accs[j][r])), accs[j][r])
        for j in range(n):
            sums[j] += [b.load(a) for a in accs[j]]
    def cap(s: ir.Value) -> ir.Value:
        return s if softcap is None else _softcap(b, s, softcap)

    if len(k_rows) == ROWS:
        return [cap(b.fmul(builder.hsum4x8(b, sums[j]), builder.splat(b, scale, ROWS))) for j in range(n)]
    assert len(k_rows) == 1
    return [cap(b.fmul(builder.hsum(b, sums[j][0]), scale)) for j in range(n)]


def _prefetch(b: ir.IRBuilder, ptr: ir.Value) -> None:
    """A read prefetch into all cache levels (never faults, changes no result)."""
    i8p = ir.IntType(8).as_pointer()
    fn = b.module.globals.get("llvm.prefetch.p0")
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ir.VoidType(), [i8p, I32, I32, I32]), name="llvm.prefetch.p0")
    b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _run_heads(n_head: int, n_kv_head: int) -> int:
    """The most heads one run takes together (_runs_of_heads): a kv head's group, at most GROUP_MAX."""
    return min(n_head // max(n_kv_head, 1), GROUP_MAX)


def exact_scratch_floats(n_keys: int, n_head: int = 1, n_kv_head: int = 1) -> int:
    """Scratch floats per thread for attention_exact: a scores row (whole vectors) per head of
    a run."""
    return _run_heads(n_head, n_kv_head) * (-(-n_keys // VEC) * VEC)


def f16acc_scratch_floats(n_head: int, n_kv_head: int, head_dim: int) -> int:
    """Scratch floats per thread for attention_f16acc: per head run together its q16 row, and
    its block's scores, rescale and value factors."""
    return _run_heads(n_head, n_kv_head) * (head_dim + 3 * BLOCK_KEYS)


def _define_f16acc(module: ir.Module, f16c: bool, registers: int, sinks: bool = False) -> None:
    b, args = _define(module, FUNCTION_F16ACC, "scratch", sinks)  # see f16acc_scratch_floats
    (q, k, v, out, scratch, _n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end,
     window, ring, softcap) = args[:16]
    sink_logits = args[16] if sinks else None
    row_stride = b.mul(n_kv_head, head_dim)
    group = b.sdiv(n_head, n_kv_head)
    wide = b.icmp_signed("==", b.and_(head_dim, i64(2 * VEC - 1)), i64(0))  # 16-lane passes fit

    def heads(w: ir.Value, n: int) -> None:
        """Items w .. w + n - 1 (one query, consecutive heads of one kv head) in one pass over
        the keys, BLOCK_KEYS at a time: each head keeps its own q16 row, running max and sum and
        f16 accumulator (its output row), with exactly the operations it would see alone; key
        and value rows are converted from f16 once for all n."""
        it = _item(b, w, q, k, v, out, n_head, group, head_dim, pos0, window, ring, row_stride)
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
                row = it.row(b, base, _min(b, b.add(first, i64(r)), b.sub(n_keys, i64(1))))
                with counted_loop(b, i64(0), head_dim, 32, "pfc") as c:  # 32 f16: one line
                    _prefetch(b, gep(b, row, c))
                _prefetch(b, gep(b, row, b.sub(head_dim, i64(1))))

        def block_scores(t0: ir.Value, count: ir.Value) -> None:
            """score_rows[j][r] = scale * (q16_j . k[t0 + r]) for r < count (see _scores); the
            next block's key rows and this block's value rows are prefetched meanwhile."""
            count4 = builder.round_down(b, count, ROWS)
            with counted_loop(b, i64(0), count4, ROWS, "s4") as r:
                t = b.add(t0, r)
                prefetch_rows(k_head, b.add(t, i64(BLOCK_KEYS)), ROWS)
                prefetch_rows(v_head, t, ROWS)
                rows = [it.row(b, k_head, b.add(t, i64(i))) for i in range(ROWS)]
                for j, s4 in enumerate(_scores(b, q16_rows, rows, head_dim, scale, softcap, f16c, registers)):
                    store(b, s4, score_rows[j], r)
            with counted_loop(b, count4, count, 1, "s1") as r:
                rows = [it.row(b, k_head, b.add(t0, r))]
                for j, s1 in enumerate(_scores(b, q16_rows, rows, head_dim, scale, softcap, f16c, registers)):
                    store(b, s1, score_rows[j], r)

        def block_softmax(count: ir.Value) -> ir.Value:
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

        def block_accumulate(t0: ir.Value, count: ir.Value, lanes: int, new_keys: ir.Value) -> None:
            """acc = f16(acc * ms) then acc = f16(acc + v * vs), key by key, for every head. The
            accumulators of `per_pass` vectors of head_dim stay in registers across the block's
            keys; the value rows are converted once. The rescale runs only for the keys with a
            bit in new_keys (a branch that rarely goes that way after the first keys): for the
            others every ms is 1 and f16(acc * 1) = acc. Elementwise, so the lane count changes
            no bit."""
            vty = ir.VectorType(F32, lanes)
            per_pass = _vectors_per_pass(n, lanes, registers)

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
            count = _min(b, b.sub(n_keys, t0), i64(BLOCK_KEYS))
            block_scores(t0, count)
            new_keys = block_softmax(count)
            with b.if_else(wide) as (w16, w8):
                with w16:
                    block_accumulate(t0, count, 2 * VEC, new_keys)
                with w8:
                    block_accumulate(t0, count, VEC, new_keys)

        for j in range(n):  # l >= 1: the max key adds 1
            sink = _sink(b, sink_logits, w, j, n_head)
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

    _runs_of_heads(b, w_begin, w_end, n_head, group, heads)


def _vectors_per_pass(n: int, lanes: int, registers: int) -> int:
    """How many <lanes x float> vectors of head_dim one accumulation pass keeps per head: n heads'
    accumulators plus the converted value vectors within the vector registers, less two (the
    splat factors); a power of two (head_dims are), at most 4."""
    regs = max(1, lanes // (16 if registers >= 32 else 8))  # registers one vector takes (AVX-512: 16 floats)
    fit = max(1, (registers - 2) // ((n + 1) * regs))
    return min(4, 1 << (fit.bit_length() - 1))


def build_attention_module(f16c: bool, registers: int = 16, sinks: bool = False) -> ir.Module:
    """The attention functions, same signature:
    void f(q, k, v, out, scratch, n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end)
    over items w_begin <= w < w_end; head_dim % 8 == 0. scratch: the exact kernels' scores rows
    (exact_scratch_floats: round_up(pos0 + n_q, 8) floats per head of a run), the
    f16-accumulator kernel's q16 rows and block factors (f16acc_scratch_floats). registers: the
    vector registers the code may plan for (16, or 32 with AVX-512); no result depends on it.
    sinks: every function takes a last argument, float* sinks [n_head], one extra logit per head
    in the softmax's denominator (gpt-oss); without it the module is what it always was."""
    module = builder.new_module("attention")
    _define_exact(module, f16c, registers, sinks=sinks)
    _define_exact(module, f16c, registers, rounded=True, sinks=sinks)
    _define_f16acc(module, f16c, registers, sinks=sinks)
    return module
