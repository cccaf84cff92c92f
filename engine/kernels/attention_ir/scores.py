"""scale * (q . k) for a run of heads against a few key rows, with gemma 2's softcap: the dot
products both attention paths share, the same bits whichever keys and heads share a pass.
"""
from __future__ import annotations

from llvmlite import ir

from engine.kernels.attention_ir.f16 import load_half
from engine.kernels.attention_ir.facts import ROWS
from engine.kernels.ir import builder
from engine.kernels.ir.builder import (
    F32,
    V8F32,
    VEC,
    const,
    counted_loop,
    fmuladd,
    i64,
    load,
    variable,
)


def keys_per_score_pass(n: int, registers: int) -> int:
    """Keys whose dot products share one pass over head_dim when n heads go together: each key
    takes a register for its converted row and one accumulator per head; stay within the
    vector registers, less one."""
    return next(kp for kp in (ROWS, 2, 1) if kp * (n + 1) + 1 <= registers - 1)


def capped(b: ir.IRBuilder, s: ir.Value, cap: ir.Value) -> ir.Value:
    """cap * tanh(s / cap) (builder.tanh), for a float or a vector; cap is a float."""
    ty = s.type
    capv = builder.splat(b, cap, ty.count) if isinstance(ty, ir.VectorType) else cap
    return b.fmul(capv, builder.tanh(b, b.fdiv(s, capv)))


def _softcap(b: ir.IRBuilder, s: ir.Value, cap: ir.Value) -> ir.Value:
    """cap * tanh(s / cap) when cap > 0, else s (a branch on a per-call constant)."""
    ty = s.type
    pre = b.block
    with b.if_then(b.fcmp_ordered(">", cap, const(F32, 0.0))):
        capped_s = capped(b, s, cap)
        then = b.block
    out = b.phi(ty)
    out.add_incoming(s, pre)
    out.add_incoming(capped_s, then)
    return out


def dot_scores(b: ir.IRBuilder, q_rows: list[ir.Value], k_rows: list[ir.Value], head_dim: ir.Value,
            scale: ir.Value, softcap: ir.Value | None, f16c: bool, registers: int) -> list[ir.Value]:
    """Per query row (head), scale * (q . k) for ROWS key rows (a <ROWS x float>) or one (a float).

    Per lane an fma chain over head_dim, then hsum4x8's or hsum's (equal) fixed tree: the same
    bits whichever keys and heads share a pass over head_dim. Each key row is converted from f16
    once per pass for all the heads.
    """
    n = len(q_rows)
    kp = min(keys_per_score_pass(n, registers), len(k_rows))
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
