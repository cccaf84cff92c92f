"""The attention kernels' shared facts: function names, the sizes their loops are built on and
the scratch each needs per thread, read by the IR builders, the facade (engine.kernels.attention),
the tasks and the numpy twins alike.
"""
from __future__ import annotations

from engine.kernels.ir.builder import VEC

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


def run_heads(n_head: int, n_kv_head: int) -> int:
    """The most heads one run takes together (runs_of_heads): a kv head's group, at most GROUP_MAX."""
    return min(n_head // max(n_kv_head, 1), GROUP_MAX)


def exact_scratch_floats(n_keys: int, n_head: int = 1, n_kv_head: int = 1) -> int:
    """Scratch floats per thread for attention_exact: a scores row (whole vectors) per head of
    a run."""
    return run_heads(n_head, n_kv_head) * (-(-n_keys // VEC) * VEC)


def f16acc_scratch_floats(n_head: int, n_kv_head: int, head_dim: int) -> int:
    """Scratch floats per thread for attention_f16acc: per head run together its q16 row, and
    its block's scores, rescale and value factors."""
    return run_heads(n_head, n_kv_head) * (head_dim + 3 * BLOCK_KEYS)

