"""The attention kernels' LLVM IR (engine.kernels.attention has what they compute and why).

build_attention_module(f16c, registers, sinks) -> one module with attention_exact,
attention_rounded and attention_f16acc, same signature. The package's modules, one job each:
facts (names, loop sizes, scratch sizes: what the facade, the tasks and the numpy twins in
attention_reference.py share), f16 (f16 loads and rounding), items (the signature and the walk
over (query, head) items), scores (q . k with the softcap), exact (attention_exact and
attention_rounded), f16acc (attention_f16acc).
"""
from __future__ import annotations

from llvmlite import ir

from engine.kernels.attention_ir.blocked import define_blocked
from engine.kernels.attention_ir.exact import define_exact
from engine.kernels.attention_ir.f16acc import define_f16acc
from engine.kernels.attention_ir.facts import (
    BLOCK_KEYS,
    DEEP_CACHE,
    DEEP_MIN_QUERIES,
    FUNCTION_BLOCKED,
    FUNCTION_EXACT,
    FUNCTION_F16ACC,
    FUNCTION_ROUNDED,
    GROUP_MAX,
    TILE_KEYS,
    TILED_MIN_QUERIES,
    blocked_scratch_floats,
    exact_scratch_floats,
    f16acc_scratch_floats,
    takes_tiles,
)
from engine.kernels.ir import builder

__all__ = ["BLOCK_KEYS", "DEEP_CACHE", "DEEP_MIN_QUERIES", "FUNCTION_BLOCKED", "FUNCTION_EXACT",
           "FUNCTION_F16ACC", "FUNCTION_ROUNDED", "GROUP_MAX", "TILE_KEYS", "TILED_MIN_QUERIES",
           "blocked_scratch_floats", "build_attention_module", "exact_scratch_floats",
           "f16acc_scratch_floats", "takes_tiles"]


def build_attention_module(f16c: bool, registers: int = 16, sinks: bool = False,
                           bidirectional: bool = False) -> ir.Module:
    """The attention functions, same signature:
    void f(q, k, v, out, scratch, n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end)
    over items w_begin <= w < w_end; head_dim % 8 == 0. scratch: the exact kernels' scores rows
    (exact_scratch_floats: round_up(pos0 + n_q, 8) floats per head of a run), the
    f16-accumulator kernel's q16 rows and block factors (f16acc_scratch_floats). registers: the
    vector registers the code may plan for (16, or 32 with AVX-512); no result depends on it.
    sinks: every function takes a last argument, float* sinks [n_head], one extra logit per head
    in the softmax's denominator (gpt-oss); without it the module is what it always was.
    bidirectional: every function takes two more, bi_begin and bi_end (after sinks): the chunk's
    queries bi_begin <= i < bi_end see every key up to query bi_end - 1 too (the rows of an
    embedding span that asks for it see each other, Gemma 3's images); bi_begin = bi_end: causal."""
    module = builder.new_module("attention")
    define_exact(module, f16c, registers, sinks=sinks, bidirectional=bidirectional)
    define_exact(module, f16c, registers, rounded=True, sinks=sinks, bidirectional=bidirectional)
    define_f16acc(module, f16c, registers, sinks=sinks, bidirectional=bidirectional)
    define_blocked(module, f16c, registers, sinks=sinks, bidirectional=bidirectional)
    return module
