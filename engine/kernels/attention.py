"""Causal multi-head attention over an f16 KV cache, with grouped-query heads, compiled.

Two functions, chosen like llama.cpp's CPU flash attention chooses its paths, so our logits
follow llama.cpp's (its two paths differ by ~1e-3 relative, far more than float noise):

attention_exact (batches of >= TILED_MIN_QUERIES queries; llama.cpp's tiled f32 path):
    1. scores[t] = scale * q . k[t]    four key rows at a time, f16 -> f32 on load; running max
    2. p[t] = exp(scores[t] - max)     in place in the scores scratch; l = sum p
    3. out = (sum_t p[t] * v[t]) / l   four value rows at a time

attention_f16acc (decode and small batches; llama.cpp's one-row path): one online-softmax pass
    q16 = f16(q)                                  Q rounded once, as ggml feeds its f16 dot
    for each key t (scores four rows at a time, updates in key order):
        s = scale * (q16 . k[t])
        new max:  acc = f16(acc * e^(m - s)); m = s; p = 1
        else:     p = e^(s - m)
        acc = f16(acc + p * v[t]);  l = l * (rescale) + p
    out = acc / l
    The accumulator is f16-rounded after every step, exactly as ggml's VKQ16 row. The keys go
    in blocks of BLOCK_KEYS, in three phases with the same operations in the same order:
      a. the block's scores, four keys at a time;
      b. its softmax factors: each key's max-before from a prefix max over 16 keys, one vector
         exp for 16 keys; then l key by key;
      c. one pass over the accumulator applies the block's keys in order, the accumulator in
         registers throughout (16 lanes wide when head_dim allows), the rescale only at keys
         that set a new max (a rescale by 1 changes nothing).
    The query heads of one kv head (a run of up to GROUP_MAX consecutive items) take the keys
    together: each head keeps its own q16 row, max, sum and accumulator and sees exactly the
    operations above, in the same order, so its bits do not depend on the company it keeps; the
    key and value rows are converted from f16 once for the run, and the heads' accumulator
    chains (fma -> f16 round -> next key, latency-bound alone) are independent work the CPU
    overlaps. The next block's key rows and this block's value rows are prefetched while the
    scores run: in a forward pass they are cold, the matmuls having streamed the weights
    through the caches since the last step.

One work item is one (query, head) pair, w = query * n_head + head, over the keys it may see
(cache rows 0 .. pos0 + query). A thread runs a contiguous range of items with its own scratch
row, so threads never share writes; tasks.split_attention cuts the ranges by cost (later
queries see more keys). attention_f16acc takes a range in runs of heads sharing a kv head; a run
ends where the group, the range or GROUP_MAX does.

Attention sinks (gpt-oss; AttentionKernel(sinks=True), a module of its own): each head has one
more logit, sinks[head], in its softmax's denominator, with a value row of 0. The exact
functions take it into the max and the sum (ggml's soft_max with sinks); attention_f16acc
applies it after the last key as one more key (ggml's flash-attention sink step).
"""
from __future__ import annotations

import ctypes
import math
import operator

import numpy as np

from engine.kernels.attention_ir import (
    FUNCTION_BLOCKED,
    FUNCTION_EXACT,
    FUNCTION_F16ACC,
    FUNCTION_ROUNDED,
    blocked_scratch_floats,
    build_attention_module,
    exact_scratch_floats,
    f16acc_scratch_floats,
    takes_tiles,
)
from engine.kernels.ir import builder
from engine.kernels.ir.builder import (
    VEC,
)
from engine.kernels.jit import compile_cached, host_has
from engine.kernels.pool import Pool


def _check(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int, window: int,
           ring: int) -> None:
    if not (isinstance(q, np.ndarray) and q.dtype == np.float32 and q.ndim == 3 and q.flags.c_contiguous):
        raise TypeError("q must be a C-contiguous float32 array [n_q, n_head, head_dim]")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not (isinstance(c, np.ndarray) and c.dtype == np.float16 and c.ndim == 3 and c.flags.c_contiguous):
            raise TypeError(f"{name} must be a C-contiguous float16 array [n_ctx, n_kv_head, head_dim]")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache shape {k_cache.shape} != v_cache shape {v_cache.shape}")
    n_q, n_head, head_dim = q.shape
    n_ctx, n_kv_head, kv_dim = k_cache.shape
    if kv_dim != head_dim:
        raise ValueError(f"q head_dim {head_dim} != cache head_dim {kv_dim}")
    if head_dim % VEC:
        raise ValueError(f"head_dim must be a multiple of {VEC}, got {head_dim}")
    if n_kv_head == 0 or n_head % n_kv_head:
        raise ValueError(f"n_head {n_head} is not a multiple of n_kv_head {n_kv_head}")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    if not pos0 >= 0:
        raise ValueError(f"pos0 must be >= 0, got {pos0}")
    if ring == n_ctx:
        if pos0 + n_q > n_ctx:
            raise ValueError(f"queries at positions {pos0}..{pos0 + n_q - 1} do not fit a cache "
                             f"of {n_ctx} rows")
    elif not (window and ring + window - 1 <= n_ctx and n_q + window - 1 <= ring):
        # a ring: the chunk's own keys must not overwrite keys its first query sees, and the
        # mirrored rows past its end must hold a whole window
        raise ValueError(f"a ring of {ring} rows ({n_ctx} stored) cannot hold {n_q} queries "
                         f"with a window of {window}")


class AttentionKernel:
    """Compiled causal GQA attention; see the module docstring. Safe to call from several threads
    (calls that split work across the pool take turns)."""

    # Below this many (key row x head_dim) products one thread wins: a dispatch from here (its
    # split and step arrays built in Python) costs ~20 us, a 9-head decode step over ~400 rows.
    parallel_min_work = 1 << 18

    def __init__(self, n_threads: int = 1, *, f16c: bool | None = None,
                 pool: Pool | None = None, flash_attn: bool = True,
                 registers: int | None = None, sinks: bool = False,
                 bidirectional: bool = False) -> None:
        """flash_attn: follow llama.cpp's flash-attention paths (f16acc below TILED_MIN_QUERIES
        queries, exact from there); False: its non-flash path, attention_rounded, at every size.
        registers: the vector registers the code plans for (default: 32 with AVX-512, else 16);
        it changes the speed only, never a bit. sinks: the functions take each head's sink
        logit (every call passes `sinks`). bidirectional: the functions take a range of the
        chunk's queries that see each other (a call may pass `bidirectional`)."""
        if n_threads < 1:
            raise ValueError(f"n_threads must be >= 1, got {n_threads}")
        self.flash_attn = flash_attn
        self.f16c = host_has("f16c") if f16c is None else f16c
        if registers is None:
            registers = 32 if host_has("avx512f") else 16
        self.sinks = sinks
        self.bidirectional = bidirectional
        params: tuple[object, ...] = ((self.f16c, registers) + (("sinks",) if sinks else ())
                                      + (("bidirectional",) if bidirectional else ()))
        lib = compile_cached("attention", params, lambda: str(
            build_attention_module(self.f16c, registers, sinks, bidirectional)))
        p, n, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        args: tuple[type, ...] = ((p, p, p, p, p, n, n, n, n, n, f, n, n, n, n, f) + ((p,) if sinks else ())
                                  + ((n, n) if bidirectional else ()))
        # the functions for many queries (exact; run tiled, blocked) and for few (f16acc); all
        # rounded without FA
        many, few = (FUNCTION_EXACT, FUNCTION_F16ACC) if flash_attn else (FUNCTION_ROUNDED,) * 2
        tiled = FUNCTION_BLOCKED if flash_attn else FUNCTION_ROUNDED
        self._exact = lib.function(many, None, *args)
        self._blocked = lib.function(tiled, None, *args)
        self._f16acc = lib.function(few, None, *args)
        self.exact_address = lib.address(many)
        self.tiled_address = lib.address(tiled)  # what a chunk of >= TILED_MIN_QUERIES runs
        self.f16acc_address = lib.address(few)
        self._own_pool = pool is None and n_threads > 1
        self._pool = Pool(n_threads) if self._own_pool else pool
        self.n_threads = self._pool.n_threads if self._pool is not None else 1

    def close(self) -> None:
        if self._own_pool and self._pool is not None:
            self._pool.close()
        self._pool = None

    def __call__(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int,
                 out: np.ndarray | None = None, *, scale: float | None = None, window: int = 0,
                 ring: int | None = None, softcap: float = 0.0,
                 sinks: np.ndarray | None = None,
                 bidirectional: tuple[int, int] | None = None) -> np.ndarray:
        """q [n_q, n_head, head_dim] f32 at positions pos0.. -> [n_q, n_head, head_dim] f32.

        Query i sees the keys at positions 0 .. pos0 + i (the last `window` of them when window
        > 0). The key at position p is cache row p % ring (ring defaults to the cache's rows);
        a ring shorter than the cache mirrors its first rows past its end, as engine.kv stores
        it (window - 1 of them; a bidirectional range needs up to ring - 1). Head h reads kv head h // (n_head // n_kv_head). out may be q itself
        (but not overlap it partially). scale defaults to 1/sqrt(head_dim); softcap > 0 caps
        the scaled scores to softcap * tanh(s / softcap) (gemma 2). sinks: float32 [n_head], each
        head's sink logit, given exactly when the kernel was built with sinks. bidirectional
        (a kernel built with it): queries a <= i < b also see the keys up to query b - 1.
        """
        pos0 = operator.index(pos0)  # an int; a float position is a caller bug
        window = operator.index(window)
        ring = k_cache.shape[0] if ring is None else operator.index(ring)
        _check(q, k_cache, v_cache, pos0, window, ring)
        n_q, n_head, head_dim = q.shape
        n_kv_head = k_cache.shape[1]
        if (sinks is not None) != self.sinks:
            raise ValueError("sinks are given exactly to a kernel built with sinks=True")
        if sinks is not None and not (isinstance(sinks, np.ndarray) and sinks.dtype == np.float32
                                      and sinks.shape == (n_head,) and sinks.flags.c_contiguous):
            raise ValueError(f"sinks must be a C-contiguous float32 array of shape ({n_head},)")
        extra: tuple[int, ...] = () if sinks is None else (builder.address(sinks),)
        if bidirectional is not None and not self.bidirectional:
            raise ValueError("a bidirectional range needs a kernel built with bidirectional=True")
        if self.bidirectional:
            bi = (0, 0) if bidirectional is None else tuple(operator.index(i) for i in bidirectional)
            if len(bi) != 2 or not 0 <= bi[0] <= bi[1] <= n_q:
                raise ValueError(f"bidirectional must be a range (a, b) of the {n_q} queries, got {bidirectional}")
            # in a ring, query a reads from up to row ring - 1 on: its window, then the range's
            # later keys, all in consecutive rows, so the mirror must reach that far
            if bi[0] < bi[1] and ring != k_cache.shape[0] and \
                    k_cache.shape[0] < ring + window - 1 + bi[1] - 1 - bi[0]:
                raise ValueError(f"a bidirectional range of {bi[1] - bi[0]} queries reads past "
                                 f"the {k_cache.shape[0] - ring} rows this ring mirrors")
            extra += bi
        if out is None:
            out = np.empty_like(q)
        elif not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == q.shape
                  and out.flags.c_contiguous):
            raise ValueError(f"out must be a C-contiguous float32 array of shape {q.shape}")
        if n_q == 0:
            return out
        if scale is None:
            scale = 1.0 / math.sqrt(head_dim)

        n_items = n_q * n_head
        if takes_tiles(n_q, pos0) or not self.flash_attn:  # scores rows / blocked's tiles
            fn, stride = self._blocked, max(exact_scratch_floats(pos0 + n_q, n_head, n_kv_head),
                                            blocked_scratch_floats(head_dim))
        else:
            fn, stride = self._f16acc, f16acc_scratch_floats(n_head, n_kv_head, head_dim)  # q16 rows
        work = n_head * head_dim * (n_q * pos0 + n_q * (n_q + 1) // 2)  # key-row x dim products
        if self._pool is None or self.n_threads == 1 or work < self.parallel_min_work:
            scores = np.empty(stride, np.float32)
            fn(builder.address(q), builder.address(k_cache), builder.address(v_cache), builder.address(out),
               builder.address(scores), n_q, n_head, n_kv_head, head_dim, pos0, scale, 0, n_items,
               window, ring, softcap, *extra)
            return out
        self._run_split(q, k_cache, v_cache, out, pos0, scale, stride, window, ring, softcap, sinks,
                        extra[-2:] if self.bidirectional else None)
        return out

    def _run_split(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                   out: np.ndarray, pos0: int, scale: float, stride: int, window: int,
                   ring: int, softcap: float, sinks: np.ndarray | None,
                   bidirectional: tuple[int, ...] | None) -> None:
        """One chunk's items split by cost over the pool, through the graph's attention task."""
        from engine.kernels import tasks  # noqa: PLC0415 - tasks builds on this module

        assert self._pool is not None
        n_q, n_head, head_dim = q.shape
        seg_start, segs = tasks.split_attention([(n_q, pos0)], n_head, self.n_threads)
        chunks = np.array([[0, n_q, pos0, 0]], np.int64)                    # [1, 4]
        scratch = np.empty((self.n_threads, stride), np.float32)           # [thread, stride]
        bi = np.array([bidirectional or (0, 0)], np.int64)                 # [1, 2]
        step = tasks.STEP.pack(n_tokens=n_q, n_out=0, n_chunks=1, positions=0, kv_rows=0,
                               kv_mirror=0, chunks=chunks.ctypes.data, seg_start=seg_start.ctypes.data,
                               segs=segs.ctypes.data, out_rows=0, bidirectional=bi.ctypes.data)
        fields = dict(
            f16acc=self.f16acc_address, exact=self.tiled_address, q=builder.address(q),
            k_cache=builder.address(k_cache), v_cache=builder.address(v_cache), out=builder.address(out),
            scratch=scratch.ctypes.data, scratch_bytes=4 * stride, n_head=n_head,
            n_kv_head=k_cache.shape[1], head_dim=head_dim, scale=scale, group=0,
            window=window, ring=ring, softcap=softcap)
        if sinks is None:
            args = tasks.ATTENTION.pack(**fields)
        else:
            args = tasks.ATTENTION_SINKS.pack(**fields, sinks=builder.address(sinks))
        if sinks is None and bidirectional is None:
            task = tasks.load_tasks(host_has("f16c")).address["task_attention"]
        else:
            task = tasks.attention_task(sinks is not None, bidirectional is not None)
        self._pool.run_task(task, args, int(step.ctypes.data))
