"""The attention kernels' LLVM IR (engine.kernels.attention has what they compute and why).

build_attention_module(f16c) -> one module with attention_exact, attention_rounded and
attention_f16acc, same signature; the constants here are the facts the facade, the tasks and the
numpy twins (attention_reference.py) share.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from engine.kernels import irbuild
from engine.kernels.irbuild import (
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
VG = ir.VectorType(F32, GROUP_MAX)  # one lane per head of a run
PREFETCH_KEYS = 16  # how many key rows ahead attention_f16acc prefetches


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


def _define(module: ir.Module, name: str, scratch: str) -> tuple[ir.IRBuilder, list[ir.Value]]:
    """Both functions' signature; `scratch` names the per-thread scratch row."""
    return irbuild.define(module, name, ir.VoidType(), [
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
        ("softcap", F32)])         # scores become softcap * tanh(s / softcap) (0: off)


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
    return _Item(n_keys, irbuild.round_down(b, n_keys, ROWS), gep(b, q, b.mul(w, head_dim)),
                 gep(b, out, b.mul(w, head_dim)), gep(b, k, first), gep(b, v, first), row_stride)


def _define_exact(module: ir.Module, f16c: bool, rounded: bool = False) -> None:
    """attention_exact, or (rounded) attention_rounded: llama.cpp without flash attention,
    which takes q as f16 for q . k and the normalised probabilities as f16 for p . v."""
    name = FUNCTION_ROUNDED if rounded else FUNCTION_EXACT
    b, args = _define(module, name, "scores")  # scores: [run heads, round_up(n_keys, 8)]
    (q, k, v, out, scores, _n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end,
     window, ring, softcap) = args
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
        stride = irbuild.round_down(b, b.add(n_keys, i64(VEC - 1)), VEC)  # whole vectors
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
            for j, s4 in enumerate(_scores(b, q_rows, rows, head_dim, scale, None, f16c)):
                store(b, s4, score_rows[j], t)
                b.store(irbuild.maxnum(b, b.load(max4[j]), s4), max4[j])
        max1 = [variable(b, F32, const(F32, -math.inf), f"max1_{j}") for j in range(n)]
        with counted_loop(b, n_keys_block, n_keys, 1, "tt") as t:
            for j, s1 in enumerate(_scores(b, q_rows, [it.row(b, k_head, t)], head_dim, scale, None, f16c)):
                store(b, s1, score_rows[j], t)
                b.store(irbuild.maxnum(b, b.load(max1[j]), s1), max1[j])
        mx1 = [irbuild.maxnum(b, irbuild.hmax(b, b.load(max4[j])), b.load(max1[j])) for j in range(n)]
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
        mx = [irbuild.splat(b, phi) for phi in phis]

        # -- pass 2: p = exp(s - max) in place, l = sum p ---------------------------------
        keys = irbuild.splat(b, b.trunc(n_keys, I32))
        inv_l = []
        for j in range(n):
            total = variable(b, V8F32, const(V8F32, 0.0), f"total{j}")
            with counted_loop(b, i64(0), n_keys, VEC, "e") as t:
                lane = b.add(irbuild.splat(b, b.trunc(t, I32)), ir.Constant(V8I32, list(range(VEC))))
                p = irbuild.exp(b, b.fsub(load(b, score_rows[j], t, V8F32), mx[j]))
                p = b.select(b.icmp_signed("<", lane, keys), p, const(V8F32, 0.0))  # lanes past the last key
                store(b, p, score_rows[j], t)
                b.store(b.fadd(b.load(total), p), total)
            inv_l.append(irbuild.splat(b, b.fdiv(const(F32, 1.0), irbuild.hsum(b, b.load(total)))))

        def prob(j: int, t: ir.Value) -> ir.Value:
            """Head j's p[t] splat, as pass 3 multiplies it into v (rounded: f16(p[t] / l))."""
            p = irbuild.splat(b, load(b, score_rows[j], t))
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


def _keys_per_score_pass(n: int) -> int:
    """Keys whose dot products share one pass over head_dim when n heads go together: each key
    takes a register for its converted row and one accumulator per head; stay within 16."""
    return next(kp for kp in (ROWS, 2, 1) if kp * (n + 1) + 1 <= 15)


def _capped(b: ir.IRBuilder, s: ir.Value, cap: ir.Value) -> ir.Value:
    """cap * tanh(s / cap) (irbuild.tanh), for a float or a vector; cap is a float."""
    ty = s.type
    capv = irbuild.splat(b, cap, ty.count) if isinstance(ty, ir.VectorType) else cap
    return b.fmul(capv, irbuild.tanh(b, b.fdiv(s, capv)))


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
            scale: ir.Value, softcap: ir.Value | None, f16c: bool) -> list[ir.Value]:
    """Per query row (head), scale * (q . k) for ROWS key rows (a <ROWS x float>) or one (a float).

    Per lane an fma chain over head_dim, then hsum4x8's or hsum's (equal) fixed tree: the same
    bits whichever keys and heads share a pass over head_dim. Each key row is converted from f16
    once per pass for all the heads.
    """
    n = len(q_rows)
    kp = min(_keys_per_score_pass(n), len(k_rows))
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
        return [cap(b.fmul(irbuild.hsum4x8(b, sums[j]), irbuild.splat(b, scale, ROWS))) for j in range(n)]
    assert len(k_rows) == 1
    return [cap(b.fmul(irbuild.hsum(b, sums[j][0]), scale)) for j in range(n)]


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
    """Scratch floats per thread for attention_f16acc: the q16 rows of the heads run together."""
    return _run_heads(n_head, n_kv_head) * head_dim


def _define_f16acc(module: ir.Module, f16c: bool) -> None:
    b, args = _define(module, FUNCTION_F16ACC, "q16")  # q16: [run heads, head_dim], q in f16
    (q, k, v, out, q16, _n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end,
     window, ring, softcap) = args
    row_stride = b.mul(n_kv_head, head_dim)
    group = b.sdiv(n_head, n_kv_head)
    wide = b.icmp_signed("==", b.and_(head_dim, i64(2 * VEC - 1)), i64(0))  # 16-lane passes fit

    def heads(w: ir.Value, n: int) -> None:
        """Items w .. w + n - 1 (one query, consecutive heads of one kv head) in one pass over
        the keys: each head keeps its own q16 row, running max and sum and f16 accumulator (its
        output row), with exactly the operations it would see alone; key and value rows are
        converted from f16 once for all n."""
        it = _item(b, w, q, k, v, out, n_head, group, head_dim, pos0, window, ring, row_stride)
        n_keys, n_keys_block, k_head, v_head = it.n_keys, it.n_keys_block, it.k_head, it.v_head
        off = [b.mul(b.add(w, i64(j)), head_dim) for j in range(n)]
        out_rows = [gep(b, out, o) for o in off]
        q16_rows = [gep(b, q16, b.mul(i64(j), head_dim)) for j in range(n)]

        # q rounded to f16 once per item, as ggml converts Q for its f16 dot products
        with counted_loop(b, i64(0), head_dim, VEC, "qr") as c:
            for j in range(n):  # read q before zeroing out: they may be the same row
                store(b, round_half(b, load(b, gep(b, q, off[j]), c, V8F32), f16c), q16_rows[j], c)
                store(b, const(V8F32, 0.0), out_rows[j], c)
        m_run = variable(b, VG, const(VG, -math.inf), "m_run")  # [head] running max score
        s_run = variable(b, VG, const(VG, 0.0), "s_run")        # [head] running sum of exp

        def scores(rows: list[ir.Value]) -> list[list[ir.Value]]:
            """[head][key] the scores scale * (q16 . k) of len(rows) keys (see _scores)."""
            per_head = _scores(b, q16_rows, rows, head_dim, scale, softcap, f16c)
            if len(rows) == 1:
                return [[s] for s in per_head]
            return [[b.extract_element(s4, ir.Constant(I32, r)) for r in range(ROWS)] for s4 in per_head]

        def softmax_steps(s: list[list[ir.Value]]) -> list[tuple[list[ir.Value], list[ir.Value], ir.Value]]:
            """Per head, the running max and sum over its keys' scores s[head] in key order; each
            key's accumulator factors ms (rescale: e^(m_old - s) on a new max, else 1) and vs
            (e^(s - m), 1 on a new max), and whether any key set a new max. The heads are lanes
            of one <GROUP_MAX x float> (elementwise, so each lane has the bits of a lone head),
            and one exp call serves all keys and heads."""
            n_k = len(s[0])
            m = b.load(m_run)
            new_max, diffs = [], []
            for r in range(n_k):
                sr = const(VG, 0.0)  # lanes past n heads: harmless filler
                for j in range(n):
                    sr = b.insert_element(sr, s[j][r], ir.Constant(I32, j))
                nm = b.fcmp_ordered(">", sr, m)
                diffs.append(b.select(nm, b.fsub(m, sr), b.fsub(sr, m)))  # <= 0
                new_max.append(nm)
                m = b.select(nm, sr, m)
            b.store(m, m_run)
            lanes = list(range(GROUP_MAX * n_k))
            joined = diffs[0] if n_k == 1 else irbuild.shuffle(
                b, irbuild.shuffle(b, diffs[0], diffs[1], lanes[:2 * GROUP_MAX]),
                irbuild.shuffle(b, diffs[2], diffs[3], lanes[:2 * GROUP_MAX]), lanes)
            e_all = irbuild.exp(b, joined)
            es = [irbuild.shuffle(b, e_all, e_all, lanes[r * GROUP_MAX:(r + 1) * GROUP_MAX]) for r in range(n_k)]
            ones = const(VG, 1.0)
            ms = [b.select(nm, e, ones) for nm, e in zip(new_max, es)]
            vs = [b.select(nm, ones, e) for nm, e in zip(new_max, es)]
            for r in range(n_k):
                b.store(fmuladd(b, b.load(s_run), ms[r], vs[r]), s_run)
            any_new = new_max[0]
            for nm in new_max[1:]:
                any_new = b.or_(any_new, nm)
            lane = [ir.Constant(I32, j) for j in range(n)]
            return [([b.extract_element(x, lane[j]) for x in ms], [b.extract_element(x, lane[j]) for x in vs],
                     b.extract_element(any_new, lane[j])) for j in range(n)]

        def accumulate(v_rows: list[ir.Value], factors: list[tuple[list[ir.Value], list[ir.Value], ir.Value]],
                       lanes: int) -> None:
            """acc = f16(acc * ms) then f16(acc + v * vs), key by key, for every head; the value
            rows converted once per chunk of lanes. A head with no new max among these keys has
            ms = 1 and f16(acc * 1) = acc, so it skips the rescales (a branch that goes the same
            way across the pass). Elementwise, so the lane count changes no bit: 16 where head_dim
            allows (one AVX-512 conversion instead of two)."""
            vty = ir.VectorType(F32, lanes)
            splats = [([irbuild.splat(b, x, lanes) for x in ms], [irbuild.splat(b, x, lanes) for x in vs])
                      for ms, vs, _ in factors]
            with counted_loop(b, i64(0), head_dim, lanes, "cv") as c:
                vals = [load_half(b, row, c, f16c, lanes) for row in v_rows]
                for j, (msv, vsv) in enumerate(splats):
                    acc0 = load(b, out_rows[j], c, vty)
                    results = []
                    with b.if_else(factors[j][2], likely=False) as (then_rescale, then_add):
                        for rescale, branch in ((True, then_rescale), (False, then_add)):
                            with branch:
                                acc = acc0
                                for r, val in enumerate(vals):
                                    if rescale:
                                        acc = round_half(b, b.fmul(acc, msv[r]), f16c)
                                    acc = round_half(b, fmuladd(b, val, vsv[r], acc), f16c)
                                results.append((acc, b.block))
                    acc = b.phi(vty)
                    for value, block in results:
                        acc.add_incoming(value, block)
                    store(b, acc, out_rows[j], c)

        def keys(t: ir.Value, count: int) -> None:
            """Keys t .. t + count - 1 for all n heads: scores, softmax steps, accumulation."""
            k_rows = [it.row(b, k_head, b.add(t, i64(r))) for r in range(count)]
            v_rows = [it.row(b, v_head, b.add(t, i64(r))) for r in range(count)]
            s = scores(k_rows)
            factors = softmax_steps(s)
            if count == 1:  # one key is always applied with its rescale, 8 lanes (ggml's order)
                factors = [(ms, vs, ir.Constant(ir.IntType(1), 1)) for ms, vs, _ in factors]
                accumulate(v_rows, factors, VEC)
                return
            with b.if_else(wide) as (w16, w8):
                with w16:
                    accumulate(v_rows, factors, 2 * VEC)
                with w8:
                    accumulate(v_rows, factors, VEC)

        def prefetch_rows(first: ir.Value, stop: ir.Value) -> None:
            """Ask for key and value rows first .. stop - 1 (clamped to the last key) ahead of
            use: the cache rows are cold after the step's matmuls streamed the weights through."""
            with counted_loop(b, first, stop, 1, "pf") as t:
                key = _min(b, t, b.sub(n_keys, i64(1)))
                for base in (k_head, v_head):
                    row = it.row(b, base, key)
                    with counted_loop(b, i64(0), head_dim, 32, "pfc") as c:  # 32 f16: one line
                        _prefetch(b, gep(b, row, c))
                    _prefetch(b, gep(b, row, b.sub(head_dim, i64(1))))

        prefetch_rows(i64(0), i64(PREFETCH_KEYS))
        with counted_loop(b, i64(0), n_keys_block, ROWS, "t") as t:
            ahead = b.add(t, i64(PREFETCH_KEYS))
            prefetch_rows(ahead, b.add(ahead, i64(ROWS)))
            keys(t, ROWS)
        with counted_loop(b, n_keys_block, n_keys, 1, "tt") as t:
            keys(t, 1)

        inv_sums = b.fdiv(const(VG, 1.0), b.load(s_run))  # s_run >= 1: the max key adds 1
        for j in range(n):
            inv_s = irbuild.splat(b, b.extract_element(inv_sums, ir.Constant(I32, j)))
            with counted_loop(b, i64(0), head_dim, VEC, "n") as c:
                store(b, b.fmul(load(b, out_rows[j], c, V8F32), inv_s), out_rows[j], c)

    _runs_of_heads(b, w_begin, w_end, n_head, group, heads)


def build_attention_module(f16c: bool) -> ir.Module:
    """Both attention functions, same signature:
    void f(q, k, v, out, scratch, n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end)
    over items w_begin <= w < w_end; head_dim % 8 == 0. scratch: the exact kernels' scores rows
    (exact_scratch_floats: round_up(pos0 + n_q, 8) floats per head of a run), the
    f16-accumulator kernel's q16 rows
    (f16acc_scratch_floats: one head_dim row per head of a run)."""
    module = irbuild.new_module("attention")
    _define_exact(module, f16c)
    _define_exact(module, f16c, rounded=True)
    _define_f16acc(module, f16c)
    return module
