"""The attention functions' signature and their walk over work items: one (query, head) pair
w = query * n_head + head, the keys it sees and the rows it reads and writes, taken in runs of
heads that share a kv head.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from engine.kernels.attention_ir.facts import GROUP_MAX, ROWS
from engine.kernels.ir import builder
from engine.kernels.ir.builder import (
    F32,
    F32P,
    I16,
    I64,
    gep,
    i64,
    load,
)


def define(module: ir.Module, name: str, scratch: str, sinks: bool = False,
           bidirectional: bool = False) -> tuple[ir.IRBuilder, list[ir.Value]]:
    """Both functions' signature; `scratch` names the per-thread scratch row; sinks adds an
    argument, float* sinks [n_head]: each head's sink logit (gpt-oss); bidirectional adds two
    last, bi_begin and bi_end: the queries bi_begin <= i < bi_end of the chunk also see the keys
    up to query bi_end - 1 (an image's rows see each other: Gemma 3)."""
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
        #                            the mirror, also row p % ring + ring: engine.kv's mirror)
        ("softcap", F32)]          # scores become softcap * tanh(s / softcap) (0: off)
        + ([("sinks", F32P)] if sinks else [])
        + ([("bi_begin", I64), ("bi_end", I64)] if bidirectional else []))


def head_sink(b: ir.IRBuilder, sinks: ir.Value | None, w: ir.Value, j: int,
          n_head: ir.Value) -> ir.Value | None:
    """Head j of the run starting at item w: its sink logit (None without sinks). A sink is one
    more logit in the softmax's denominator whose value row is 0 (llama.cpp's attn_sinks)."""
    if sinks is None:
        return None
    return load(b, sinks, b.add(b.srem(w, n_head), i64(j)))


@dataclass(frozen=True)
class Item:
    """Where one (query, head) work item w = query * n_head + head reads and writes."""
    n_keys: ir.Value        # keys it sees: min(pos0 + query + 1, window) (+ a span's later rows)
    n_keys_block: ir.Value  # n_keys rounded down to ROWS
    q_row: ir.Value         # [head_dim] its query
    out_row: ir.Value       # [head_dim] its output
    k_head: ir.Value        # its kv head in its first key's row (row stride n_kv_head * head_dim):
    v_head: ir.Value        # cache row (pos0 + query + 1 - n_keys) % ring; and its first value
    row_stride: ir.Value

    def row(self, b: ir.IRBuilder, head: ir.Value, t: ir.Value) -> ir.Value:
        """Its t-th key's (or value's) row, t < n_keys: consecutive rows, also where a ring
        wraps, since a ring's first rows are mirrored past its end (engine.kv)."""
        return gep(b, head, b.mul(t, self.row_stride))


def item(b: ir.IRBuilder, w: ir.Value, q: ir.Value, k: ir.Value, v: ir.Value, out: ir.Value,
          n_head: ir.Value, group: ir.Value, head_dim: ir.Value, pos0: ir.Value,
          window: ir.Value, ring: ir.Value, row_stride: ir.Value,
          bidirectional: tuple[ir.Value, ir.Value] | None = None) -> Item:
    """bidirectional: (bi_begin, bi_end); a query inside sees bi_end - 1 - query keys more, the
    keys after it up to query bi_end - 1 (its window's start stays where causality puts it)."""
    query = b.sdiv(w, n_head)
    kv_head = b.sdiv(b.srem(w, n_head), group)
    n_all = b.add(b.add(pos0, query), i64(1))  # keys up to and including its own position
    clipped = b.and_(b.icmp_signed(">", window, i64(0)), b.icmp_signed(">", n_all, window))
    n_keys = b.select(clipped, window, n_all)
    first = b.add(b.mul(b.urem(b.sub(n_all, n_keys), ring), row_stride), b.mul(kv_head, head_dim))
    if bidirectional is not None:
        bi_begin, bi_end = bidirectional
        inside = b.and_(b.icmp_signed(">=", query, bi_begin), b.icmp_signed("<", query, bi_end))
        n_keys = b.add(n_keys, b.select(inside, b.sub(bi_end, b.add(query, i64(1))), i64(0)))
    return Item(n_keys, builder.round_down(b, n_keys, ROWS), gep(b, q, b.mul(w, head_dim)),
                 gep(b, out, b.mul(w, head_dim)), gep(b, k, first), gep(b, v, first), row_stride)



def runs_of_heads(b: ir.IRBuilder, w_begin: ir.Value, w_end: ir.Value, n_head: ir.Value,
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
    n = min_i64(b, min_i64(b, left_in_group, b.sub(w_end, w)), i64(GROUP_MAX))
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



def min_i64(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)
