"""The attention kernels' shared facts: function names, the sizes their loops are built on and
the scratch each needs per thread, read by the IR builders, the facade (engine.kernels.attention),
the tasks and the numpy twins alike.
"""
from __future__ import annotations

from typing import Any

from engine.kernels.ir.builder import VEC, i64

ROWS = 4  # key/value rows per step: 4 accumulators + q + conversions fit in 16 registers

FUNCTION_EXACT = "attention_exact"    # three passes, f32 softmax: llama.cpp's tiled path
FUNCTION_F16ACC = "attention_f16acc"  # online softmax, f16 accumulator: its one-row path
FUNCTION_BLOCKED = "attention_blocked"  # exact's f32 softmax online, in tiles of rows that
#                                          read each key block once (prefill over long caches)
FUNCTION_ROUNDED = "attention_rounded"  # exact's passes with q and p rounded to f16: llama.cpp
#                                          without flash attention (every batch size)
# llama.cpp's CPU flash attention takes its tiled (f32) path once a batch has this many queries,
# and its one-query-row path (f16 accumulator) below; we follow the same switch ...
TILED_MIN_QUERIES = 64
# ... except over a deep cache, where the one-row path reads the whole cache once per query: a
# chunk of DEEP_MIN_QUERIES or more after DEEP_CACHE cached rows (an agent's next turn) takes the
# tiles too. 50 tokens after 6,000 cached: 510 ms on SmolLM2 (2 threads), 211 ms in tiles, and
# f32 is the closer to exact math. Short contexts keep llama.cpp's switch bit for bit, and so do
# decode and the verification of a default 8-token draft (a drafted greedy text is the plain one).
DEEP_MIN_QUERIES = 16
DEEP_CACHE = 1024


def takes_tiles(n_q: int, pos0: int) -> bool:
    """Whether a chunk of n_q queries after pos0 cached rows runs the tiled f32 function."""
    return n_q >= TILED_MIN_QUERIES or (n_q >= DEEP_MIN_QUERIES and pos0 >= DEEP_CACHE)
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



TILE_ROWS = 32  # attention_blocked: (query, head) rows a tile takes at most (16 with AVX2's plan)
TILE_KEYS = 16  # attention_blocked: keys per block, aligned to key positions

# attention_blocked's scratch per thread: name -> (multiple of head_dim, floats more)
_BLOCKED_SCRATCH = {
    "qt": (0, 0),                                   # [head_dim][TILE_ROWS] the queries
    "o": (TILE_ROWS, 0),                            # [TILE_ROWS][head_dim] the accumulators
    "k32": (2 * TILE_ROWS, 0),                      # [TILE_KEYS][head_dim] the block's keys
    "v32": (2 * TILE_ROWS + TILE_KEYS, 0),          # [TILE_KEYS][head_dim] and values
    "s": (2 * TILE_ROWS + 2 * TILE_KEYS, 0),        # [TILE_KEYS][TILE_ROWS] scores, then p
    "alpha": (2 * TILE_ROWS + 2 * TILE_KEYS, TILE_KEYS * TILE_ROWS),  # [TILE_ROWS] each:
    "sink": (2 * TILE_ROWS + 2 * TILE_KEYS, TILE_KEYS * TILE_ROWS + TILE_ROWS),
    "first": (2 * TILE_ROWS + 2 * TILE_KEYS, TILE_KEYS * TILE_ROWS + 2 * TILE_ROWS),  # i32
    "last": (2 * TILE_ROWS + 2 * TILE_KEYS, TILE_KEYS * TILE_ROWS + 3 * TILE_ROWS),   # i32
    "w": (2 * TILE_ROWS + 2 * TILE_KEYS, TILE_KEYS * TILE_ROWS + 4 * TILE_ROWS),      # i64
}


def blocked_scratch_floats(head_dim: int) -> int:
    """Scratch floats per thread for attention_blocked (and its fallback, attention_exact, for a
    head_dim not a multiple of 16: callers take the max with exact_scratch_floats)."""
    return (2 * TILE_ROWS + 2 * TILE_KEYS) * head_dim + TILE_KEYS * TILE_ROWS + 6 * TILE_ROWS


def blocked_scratch_layout(head_dim: Any, b: Any) -> dict[str, Any]:
    """Offsets (floats) of attention_blocked's scratch arrays, as IR values of head_dim."""
    return {name: b.add(b.mul(head_dim, i64(a)), i64(c)) for name, (a, c) in _BLOCKED_SCRATCH.items()}
