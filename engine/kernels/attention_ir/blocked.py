"""attention_blocked: flash-attention-style tiles for prefill chunks over long caches.

The exact function reads every key and value row once per (query, head run); a 512-token chunk
over a 6k prefix then streams 3k rows of K and V per query. Here a tile of up to TILE_ROWS
(query, head) rows that share a kv head takes the keys together, TILE_KEYS at a time:

    per tile:  qt = its rows' queries, transposed [head_dim][rows] (rows in vector lanes)
               m = -inf, l = 0, o = 0                                     per row
    per block of TILE_KEYS keys (key positions aligned to TILE_KEYS, from the tile's first key
    to its last), the block's K and V rows converted from f16 once for the whole tile:
        s[t] = scale * (q . k[t])        an fma chain over head_dim, per lane (row)
        s[t] = cap(s[t]); s[t] = -inf where row r does not see key t (causal, window, span)
        m' = max(m, max_t s[t]);  a = e^(m - m');  p[t] = e^(s[t] - m')   (m' = -inf: 0 instead)
        l = l * a + (p[0] + p[1] + ... in key order);  o = o * a + p[0] v[0] + p[1] v[1] + ...
    out = o / l  (sinks: one more logit, sink, taken in at the end with a value of 0)

Every operation is per row, in an order fixed by the key positions alone: a row's bits do not
depend on which rows share its tile, how the items were cut between threads, the register plan
(16 or 32 registers) or the vector width; a block no row of the tile sees changes nothing
(a = 1, p = 0), so it is skipped. The scores of a block live in scratch ([TILE_KEYS][rows]);
no row of scores over all keys is ever written. head_dim must be a multiple of 16: other
calls go to attention_exact whole (a per-call constant, so the bits still do not depend on the
split). Its numpy twin is attention_reference.attention_blocked_reference.
"""
from __future__ import annotations

import math

from llvmlite import ir

from engine.kernels.attention_ir.f16 import load_half
from engine.kernels.attention_ir.facts import (
    FUNCTION_BLOCKED,
    FUNCTION_EXACT,
    TILE_KEYS,
    TILE_ROWS,
    blocked_scratch_layout,
)
from engine.kernels.attention_ir.items import define
from engine.kernels.attention_ir.scores import capped
from engine.kernels.ir import builder
from engine.kernels.ir.builder import (
    F32,
    I32,
    I64,
    const,
    counted_loop,
    fmuladd,
    gep,
    i64,
    load,
    store,
    variable,
)

LANES = 16
V16 = ir.VectorType(F32, LANES)
V16I32 = ir.VectorType(I32, LANES)


def register_plan(registers: int) -> tuple[int, int, int, int]:
    """(row vectors per tile, keys per score pass, rows per p.v pass, 16-float columns per p.v
    pass) for the vector registers at hand (a <16 x float> takes two with AVX2). Speed only."""
    if registers >= 32:
        return 2, 8, 4, 4
    return 1, 4, 2, 2


def define_blocked(module: ir.Module, f16c: bool, registers: int, sinks: bool = False,
                   bidirectional: bool = False) -> None:
    """attention_blocked, the exact functions' signature (items.define); attention_exact must be
    in the module already (the fallback for head_dim % 16)."""
    b, args = define(module, FUNCTION_BLOCKED, "scratch", sinks, bidirectional)
    (q, k, v, out, scratch, _n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end,
     window, ring, softcap) = args[:16]
    sink_logits = args[16] if sinks else None
    bi = (args[-2], args[-1]) if bidirectional else None
    nv, ks, rs, dc = register_plan(registers)
    rows = nv * LANES                               # a tile's rows (vector lanes)
    assert rows <= TILE_ROWS and TILE_KEYS % ks == 0

    # -- head_dim not a multiple of 16: the exact function, whole ------------------------------
    odd = b.icmp_signed("!=", b.and_(head_dim, i64(LANES - 1)), i64(0))
    with b.if_then(odd, likely=False):
        b.call(module.get_global(FUNCTION_EXACT), list(args))
        b.ret_void()

    lay = blocked_scratch_layout(head_dim, b)
    qt = gep(b, scratch, lay["qt"])          # [head_dim][TILE_ROWS]
    o = gep(b, scratch, lay["o"])            # [TILE_ROWS][head_dim]
    s_blk = gep(b, scratch, lay["s"])        # [TILE_KEYS][TILE_ROWS] scores, then p
    k32 = gep(b, scratch, lay["k32"])        # [TILE_KEYS][head_dim]
    v32 = gep(b, scratch, lay["v32"])        # [TILE_KEYS][head_dim]
    alpha = gep(b, scratch, lay["alpha"])    # [TILE_ROWS] the block's rescale per row
    sink_row = gep(b, scratch, lay["sink"])  # [TILE_ROWS]
    first = b.bitcast(gep(b, scratch, lay["first"]), I32.as_pointer())  # [TILE_ROWS] key positions
    last = b.bitcast(gep(b, scratch, lay["last"]), I32.as_pointer())
    w_of = b.bitcast(gep(b, scratch, lay["w"]), I64.as_pointer())      # [TILE_ROWS] items
    R = i64(TILE_ROWS)
    group = b.sdiv(n_head, n_kv_head)
    row_stride = b.mul(n_kv_head, head_dim)   # f16 elements per cache row

    def tile(kv_head: ir.Value, count: ir.Value, kmin: ir.Value, kmax: ir.Value) -> None:
        """The tile's `count` rows (qt, first, last, w, sink filled) over keys kmin..kmax."""
        m = [variable(b, V16, const(V16, -math.inf), f"m{j}") for j in range(nv)]
        ell = [variable(b, V16, const(V16, 0.0), f"l{j}") for j in range(nv)]
        with counted_loop(b, i64(0), b.mul(R, head_dim), LANES, "oz") as c:
            store(b, const(V16, 0.0), o, c)
        firsts = [load(b, first, i64(LANES * j), V16I32) for j in range(nv)]
        lasts = [load(b, last, i64(LANES * j), V16I32) for j in range(nv)]
        # a block every lane sees whole (a full tile, keys from the latest first to the
        # earliest last) needs no mask: selecting every score changes no bit
        whole_tile = b.icmp_signed("==", count, i64(rows))
        f_max, l_min = b.load(fmax_var), b.load(lmin_var)
        kb0 = b.mul(b.sdiv(kmin, i64(TILE_KEYS)), i64(TILE_KEYS))
        with counted_loop(b, kb0, b.add(kmax, i64(1)), TILE_KEYS, "kb") as kb:
            convert_block(kv_head, kb, kmin, kmax)
            scores(kb)
            unmasked = b.and_(whole_tile, b.and_(b.icmp_signed(">=", kb, f_max),
                                                 b.icmp_signed("<=", b.add(kb, i64(TILE_KEYS - 1)), l_min)))
            with b.if_else(unmasked) as (then, otherwise):
                with then:
                    for j in range(nv):
                        softmax_lanes(j, kb, None, m[j], ell[j])
                with otherwise:
                    for j in range(nv):
                        softmax_lanes(j, kb, (firsts[j], lasts[j]), m[j], ell[j])
            pv(count)
        finish(count, m, ell)

    def convert_block(kv_head: ir.Value, kb: ir.Value, kmin: ir.Value, kmax: ir.Value) -> None:
        """The block's keys and values as floats; zeros for keys no row of the tile sees."""
        with counted_loop(b, i64(0), i64(TILE_KEYS), 1, "kt") as t:
            p = b.add(kb, t)
            dst_k, dst_v = gep(b, k32, b.mul(t, head_dim)), gep(b, v32, b.mul(t, head_dim))
            seen = b.and_(b.icmp_signed(">=", p, kmin), b.icmp_signed("<=", p, kmax))
            with b.if_else(seen) as (then, otherwise):
                with then:
                    src_k, src_v = cache_row(k, kv_head, p), cache_row(v, kv_head, p)
                    with counted_loop(b, i64(0), head_dim, LANES, "kc") as c:
                        store(b, load_half(b, src_k, c, f16c, LANES), dst_k, c)
                        store(b, load_half(b, src_v, c, f16c, LANES), dst_v, c)
                with otherwise, counted_loop(b, i64(0), head_dim, LANES, "kz") as c:
                    store(b, const(V16, 0.0), dst_k, c)
                    store(b, const(V16, 0.0), dst_v, c)

    def cache_row(base: ir.Value, kv_head: ir.Value, p: ir.Value) -> ir.Value:
        """Key position p's row of kv_head (a ring's primary row, p % ring)."""
        return gep(b, base, b.add(b.mul(b.urem(p, ring), row_stride), b.mul(kv_head, head_dim)))

    def scores(kb: ir.Value) -> None:
        """s[t][row] = scale * (q . k[t]) per lane an fma chain over head_dim; capped."""
        scale_v = builder.splat(b, scale, LANES)
        for t0 in range(0, TILE_KEYS, ks):
            accs = [[variable(b, V16, const(V16, 0.0), f"s{t}_{j}") for j in range(nv)]
                    for t in range(ks)]
            with counted_loop(b, i64(0), head_dim, 1, "d") as d:
                qv = [load(b, qt, b.add(b.mul(d, R), i64(LANES * j)), V16) for j in range(nv)]
                for t in range(ks):
                    kd = builder.splat(b, load(b, k32, b.add(b.mul(i64(t0 + t), head_dim), d)), LANES)
                    for j in range(nv):
                        b.store(fmuladd(b, qv[j], kd, b.load(accs[t][j])), accs[t][j])
            for t in range(ks):
                for j in range(nv):
                    store(b, b.fmul(b.load(accs[t][j]), scale_v), s_blk,
                          i64((t0 + t) * TILE_ROWS + LANES * j))
        with b.if_then(b.fcmp_ordered(">", softcap, const(F32, 0.0)), likely=False):
            for t in range(TILE_KEYS):
                for j in range(nv):
                    at = i64(t * TILE_ROWS + LANES * j)
                    store(b, capped(b, load(b, s_blk, at, V16), softcap), s_blk, at)

    def softmax_lanes(j: int, kb: ir.Value, mask: tuple[ir.Value, ir.Value] | None, m: ir.Value,
                      ell: ir.Value) -> None:
        """Lanes 16j..16j+15: the mask (first, last key positions per lane; None: every lane sees
        every key of the block), the block's max, p in place of s, the rescale in alpha."""
        at = [i64(t * TILE_ROWS + LANES * j) for t in range(TILE_KEYS)]
        maxes = []
        for t in range(TILE_KEYS):
            s = load(b, s_blk, at[t], V16)
            if mask is not None:
                pos = builder.splat(b, b.trunc(b.add(kb, i64(t)), I32), LANES)
                sees = b.and_(b.icmp_signed(">=", pos, mask[0]), b.icmp_signed("<=", pos, mask[1]))
                s = b.select(sees, s, const(V16, -math.inf))
                store(b, s, s_blk, at[t])
            maxes.append(s)
        while len(maxes) > 1:  # a tree: the max is exact in any order
            maxes = [builder.maxnum(b, x, y) for x, y in zip(maxes[::2], maxes[1::2])] + maxes[len(maxes) & ~1:]
        m_old = b.load(m)
        m_new = builder.maxnum(b, m_old, maxes[0])
        none_yet = b.fcmp_ordered("==", m_new, const(V16, -math.inf))
        m_use = b.select(none_yet, const(V16, 0.0), m_new)  # no key seen yet: o = l = 0 stay
        a = builder.exp(b, b.fsub(m_old, m_use))
        store(b, a, alpha, i64(LANES * j))
        total = const(V16, 0.0)
        for t in range(TILE_KEYS):  # the sum in key order
            pt = builder.exp(b, b.fsub(load(b, s_blk, at[t], V16), m_use))
            store(b, pt, s_blk, at[t])
            total = b.fadd(total, pt)
        b.store(fmuladd(b, b.load(ell), a, total), ell)
        b.store(m_new, m)

    def pv(count: ir.Value) -> None:
        """o[row] = o[row] * alpha[row] + sum_t p[t][row] v[t], in key order, rs rows by dc (then
        1) columns of 16 at a time."""
        def columns(r0: ir.Value, c0: ir.Value, n_cols: int) -> None:
            accs, rows_o = [], []
            for r in range(rs):
                a_r = builder.splat(b, load(b, alpha, b.add(r0, i64(r))), LANES)
                row = gep(b, o, b.mul(b.add(r0, i64(r)), head_dim))
                rows_o.append(row)
                accs.append([b.fmul(load(b, row, b.add(c0, i64(LANES * c)), V16), a_r)
                             for c in range(n_cols)])
            for t in range(TILE_KEYS):
                vv = [load(b, v32, b.add(b.mul(i64(t), head_dim), b.add(c0, i64(LANES * c))), V16)
                      for c in range(n_cols)]
                for r in range(rs):
                    pr = builder.splat(b, load(b, s_blk, b.add(i64(t * TILE_ROWS), b.add(r0, i64(r)))), LANES)
                    accs[r] = [fmuladd(b, pr, vv[c], accs[r][c]) for c in range(n_cols)]
            for r in range(rs):
                for c in range(n_cols):
                    store(b, accs[r][c], rows_o[r], b.add(c0, i64(LANES * c)))

        wide = b.mul(b.sdiv(head_dim, i64(LANES * dc)), i64(LANES * dc))
        with counted_loop(b, i64(0), count, rs, "pr") as r0:
            with counted_loop(b, i64(0), wide, LANES * dc, "pc") as c0:
                columns(r0, c0, dc)
            with counted_loop(b, wide, head_dim, LANES, "pt") as c0:
                columns(r0, c0, 1)

    def finish(count: ir.Value, m: list[ir.Value], ell: list[ir.Value]) -> None:
        """Each row's output o / l, its sink (one more logit, value 0) taken in first."""
        for j in range(nv):
            mj, lj = b.load(m[j]), b.load(ell[j])
            if sink_logits is None:
                factor = b.fdiv(const(V16, 1.0), lj)
            else:
                sv = load(b, sink_row, i64(LANES * j), V16)
                mf = builder.maxnum(b, mj, sv)
                c = builder.exp(b, b.fsub(mj, mf))
                lf = fmuladd(b, lj, c, builder.exp(b, b.fsub(sv, mf)))
                factor = b.fmul(c, b.fdiv(const(V16, 1.0), lf))
            store(b, factor, alpha, i64(LANES * j))
        with counted_loop(b, i64(0), count, 1, "fo") as r:
            f_r = builder.splat(b, load(b, alpha, r), LANES)
            src = gep(b, o, b.mul(r, head_dim))
            dst = gep(b, out, b.mul(b.load(gep(b, w_of, r)), head_dim))
            with counted_loop(b, i64(0), head_dim, LANES, "fc") as c:
                store(b, b.fmul(load(b, src, c, V16), f_r), dst, c)

    # -- the walk: per kv head, its items of [w_begin, w_end) gathered into tiles ---------------
    w_var = variable(b, I64, w_begin, "w")
    count_var = variable(b, I64, i64(0), "count")
    kmin_var = variable(b, I64, i64(0), "kmin")
    kmax_var = variable(b, I64, i64(0), "kmax")
    fmax_var = variable(b, I64, i64(0), "fmax")   # the latest first key of the tile's rows
    lmin_var = variable(b, I64, i64(0), "lmin")   # the earliest last key

    def add_row(w: ir.Value, head: ir.Value) -> None:
        """Item w (query w // n_head, head) as the tile's next row: its keys, query, sink."""
        r = b.load(count_var)
        n_all = b.add(b.add(pos0, b.sdiv(w, n_head)), i64(1))   # keys up to its own position
        clipped = b.and_(b.icmp_signed(">", window, i64(0)), b.icmp_signed(">", n_all, window))
        f = b.sub(n_all, b.select(clipped, window, n_all))
        la = b.sub(n_all, i64(1))
        if bi is not None:
            query = b.sdiv(w, n_head)
            inside = b.and_(b.icmp_signed(">=", query, bi[0]), b.icmp_signed("<", query, bi[1]))
            la = b.select(inside, b.sub(b.add(pos0, bi[1]), i64(1)), la)
        b.store(b.trunc(f, I32), gep(b, first, r))
        b.store(b.trunc(la, I32), gep(b, last, r))
        b.store(w, gep(b, w_of, r))
        if sink_logits is not None:
            store(b, load(b, sink_logits, head), sink_row, r)
        q_row = gep(b, q, b.mul(w, head_dim))
        with counted_loop(b, i64(0), head_dim, 1, "qd") as d:
            store(b, load(b, q_row, d), qt, b.add(b.mul(d, R), r))
        b.store(b.select(b.icmp_signed("<", f, b.load(kmin_var)), f, b.load(kmin_var)), kmin_var)
        b.store(b.select(b.icmp_signed(">", la, b.load(kmax_var)), la, b.load(kmax_var)), kmax_var)
        b.store(b.select(b.icmp_signed(">", f, b.load(fmax_var)), f, b.load(fmax_var)), fmax_var)
        b.store(b.select(b.icmp_signed("<", la, b.load(lmin_var)), la, b.load(lmin_var)), lmin_var)
        b.store(b.add(r, i64(1)), count_var)

    with counted_loop(b, i64(0), n_kv_head, 1, "kvh") as kv_head:
        b.store(w_begin, w_var)
        head_bb = b.append_basic_block("tile.head")
        fill_bb = b.append_basic_block("tile.fill")
        done_bb = b.append_basic_block("tile.done")
        b.branch(head_bb)
        b.position_at_end(head_bb)
        b.cbranch(b.icmp_signed("<", b.load(w_var), w_end), fill_bb, done_bb)
        b.position_at_end(fill_bb)
        b.store(i64(0), count_var)
        b.store(i64(2 ** 62), kmin_var)
        b.store(i64(-1), kmax_var)
        b.store(i64(-1), fmax_var)
        b.store(i64(2 ** 62), lmin_var)
        with counted_loop(b, i64(0), R, 1, "pad") as r:  # lanes no row takes see no key
            b.store(const(I32, 2 ** 31 - 1), gep(b, first, r))
            b.store(const(I32, -1), gep(b, last, r))
        scan_bb = b.append_basic_block("scan.head")
        scan_body = b.append_basic_block("scan.body")
        scan_done = b.append_basic_block("scan.done")
        b.branch(scan_bb)
        b.position_at_end(scan_bb)
        more = b.and_(b.icmp_signed("<", b.load(w_var), w_end),
                      b.icmp_signed("<", b.load(count_var), i64(rows)))
        b.cbranch(more, scan_body, scan_done)
        b.position_at_end(scan_body)
        w = b.load(w_var)
        head = b.srem(w, n_head)
        with b.if_then(b.icmp_signed("==", b.sdiv(head, group), kv_head)):
            add_row(w, head)
        b.store(b.add(w, i64(1)), w_var)
        b.branch(scan_bb)
        b.position_at_end(scan_done)
        with b.if_then(b.icmp_signed(">", b.load(count_var), i64(0))):
            tile(kv_head, b.load(count_var), b.load(kmin_var), b.load(kmax_var))
        b.branch(head_bb)
        b.position_at_end(done_bb)
    b.ret_void()
