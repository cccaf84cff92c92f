"""Causal multi-head attention over an f16 KV cache, with grouped-query heads, compiled.

One work item is one (query, head) pair, w = query * n_head + head. Per item, three passes over
the keys it may see (cache rows 0 .. pos0 + query):

    1. scores[t] = scale * q . k[t]    four key rows at a time, f16 -> f32 on load; running max
    2. p[t] = exp(scores[t] - max)     in place in the scores scratch; l = sum p
    3. out = (sum_t p[t] * v[t]) / l   four value rows at a time

Two passes over a scratch row of scores (rather than online softmax) keep the inner loops free
of rescaling and branches; subtracting the max keeps every exp in [0, 1], and l >= 1.
A thread runs a contiguous range of items with its own scratch row, so threads never share
writes; `split_work` cuts the ranges by cost (later queries see more keys).
"""
from __future__ import annotations

import ctypes
import math
import operator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from llvmlite import ir

from engine.kernels import ops
from engine.kernels.jit import compile_ir, host_has
from engine.kernels.ops import F32, F32P, I16, I32, I64, V8F32, VEC, const, counted_loop, fmuladd, gep, i64, load, store, variable

V8I16 = ir.VectorType(I16, VEC)
V8I32 = ir.VectorType(I32, VEC)
V4F32 = ir.VectorType(F32, 4)
ROWS = 4  # key/value rows per step: 4 accumulators + q + conversions fit in 16 registers

FUNCTION = "attention_f16kv"


def load_half8(b: ir.IRBuilder, base: ir.Value, index: ir.Value, f16c: bool) -> ir.Value:
    """8 f16 values (stored as i16) at base[index] as <8 x float>."""
    ptr = b.bitcast(gep(b, base, index), V8I16.as_pointer())
    bits = b.load(ptr, align=2)
    if f16c:  # one vcvtph2ps
        return b.fpext(b.bitcast(bits, ir.VectorType(ir.HalfType(), VEC)), V8F32)
    # Portable: put exponent+mantissa where float keeps them and rebias by 2^(127-15). The
    # multiply also turns f16 subnormals (f32 denormals here) into the right normal floats.
    h = b.zext(bits, V8I32)
    sign = b.shl(b.and_(h, const(V8I32, 0x8000)), const(V8I32, 16))
    em = b.and_(h, const(V8I32, 0x7FFF))
    shifted = b.shl(em, const(V8I32, 13))
    finite = b.bitcast(b.fmul(b.bitcast(shifted, V8F32), const(V8F32, 2.0 ** 112)), V8I32)
    special = b.or_(shifted, const(V8I32, 0x7F800000))  # inf / nan keep their mantissa
    mag = b.select(b.icmp_unsigned(">=", em, const(V8I32, 0x7C00)), special, finite)
    return b.bitcast(b.or_(mag, sign), V8F32)


def build_attention_module(f16c: bool) -> ir.Module:
    """void attention_f16kv(q, k, v, out, scores, n_q, n_head, n_kv_head, head_dim, pos0, scale,
    w_begin, w_end): items w_begin <= w < w_end. head_dim % 8 == 0. scores holds
    round_up(pos0 + n_q, 8) floats."""
    module = ops.new_module("attention")
    b, args = ops.define(module, FUNCTION, ir.VoidType(), [
        ("q", F32P),               # [n_q, n_head, head_dim]
        ("k", I16.as_pointer()),   # [n_ctx, n_kv_head, head_dim] f16 bits
        ("v", I16.as_pointer()),   # [n_ctx, n_kv_head, head_dim] f16 bits
        ("out", F32P),             # [n_q, n_head, head_dim]; may be q
        ("scores", F32P),          # [round_up(pos0 + n_q, 8)] scratch of this thread
        ("n_q", I64), ("n_head", I64), ("n_kv_head", I64), ("head_dim", I64), ("pos0", I64),
        ("scale", F32), ("w_begin", I64), ("w_end", I64)])
    q, k, v, out, scores, _n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin, w_end = args
    row_stride = b.mul(n_kv_head, head_dim)
    group = b.sdiv(n_head, n_kv_head)

    with counted_loop(b, w_begin, w_end, 1, "w") as w:
        query = b.sdiv(w, n_head)
        kv_head = b.sdiv(b.srem(w, n_head), group)
        n_keys = b.add(b.add(pos0, query), i64(1))
        n_keys_block = ops.round_down(b, n_keys, ROWS)
        q_row = gep(b, q, b.mul(w, head_dim))
        out_row = gep(b, out, b.mul(w, head_dim))
        k_head = gep(b, k, b.mul(kv_head, head_dim))
        v_head = gep(b, v, b.mul(kv_head, head_dim))

        # -- pass 1: scores and their max ------------------------------------------------
        max4 = variable(b, V4F32, const(V4F32, -math.inf), "max4")
        with counted_loop(b, i64(0), n_keys_block, ROWS, "t") as t:
            rows = [gep(b, k_head, b.mul(b.add(t, i64(r)), row_stride)) for r in range(ROWS)]
            accs = [variable(b, V8F32, const(V8F32, 0.0), f"acc{r}") for r in range(ROWS)]
            with counted_loop(b, i64(0), head_dim, VEC, "c") as c:
                qc = load(b, q_row, c, V8F32)
                for r in range(ROWS):
                    b.store(fmuladd(b, qc, load_half8(b, rows[r], c, f16c), b.load(accs[r])), accs[r])
            s4 = b.fmul(ops.hsum4x8(b, [b.load(a) for a in accs]), ops.splat(b, scale, 4))
            store(b, s4, scores, t)
            b.store(ops.maxnum(b, b.load(max4), s4), max4)
        max1 = variable(b, F32, const(F32, -math.inf), "max1")
        with counted_loop(b, n_keys_block, n_keys, 1, "tt") as t:
            row = gep(b, k_head, b.mul(t, row_stride))
            acc = variable(b, V8F32, const(V8F32, 0.0), "acc")
            with counted_loop(b, i64(0), head_dim, VEC, "ct") as c:
                b.store(fmuladd(b, load(b, q_row, c, V8F32), load_half8(b, row, c, f16c), b.load(acc)), acc)
            s = b.fmul(ops.hsum(b, b.load(acc)), scale)
            store(b, s, scores, t)
            b.store(ops.maxnum(b, b.load(max1), s), max1)
        mx = ops.splat(b, ops.maxnum(b, ops.hmax(b, b.load(max4)), b.load(max1)))

        # -- pass 2: p = exp(s - max) in place, l = sum p ---------------------------------
        total = variable(b, V8F32, const(V8F32, 0.0), "total")
        keys = ops.splat(b, b.trunc(n_keys, I32))
        with counted_loop(b, i64(0), n_keys, VEC, "e") as t:
            lane = b.add(ops.splat(b, b.trunc(t, I32)), ir.Constant(V8I32, list(range(VEC))))
            p = ops.exp(b, b.fsub(load(b, scores, t, V8F32), mx))
            p = b.select(b.icmp_signed("<", lane, keys), p, const(V8F32, 0.0))  # lanes past the last key
            store(b, p, scores, t)
            b.store(b.fadd(b.load(total), p), total)
        inv_l = ops.splat(b, b.fdiv(const(F32, 1.0), ops.hsum(b, b.load(total))))

        # -- pass 3: out = sum p v / l ----------------------------------------------------
        with counted_loop(b, i64(0), head_dim, VEC, "z") as c:
            store(b, const(V8F32, 0.0), out_row, c)
        with counted_loop(b, i64(0), n_keys_block, ROWS, "u") as t:
            ps = [ops.splat(b, load(b, scores, b.add(t, i64(r)))) for r in range(ROWS)]
            rows = [gep(b, v_head, b.mul(b.add(t, i64(r)), row_stride)) for r in range(ROWS)]
            with counted_loop(b, i64(0), head_dim, VEC, "cv") as c:
                o = load(b, out_row, c, V8F32)
                for r in range(ROWS):
                    o = fmuladd(b, ps[r], load_half8(b, rows[r], c, f16c), o)
                store(b, o, out_row, c)
        with counted_loop(b, n_keys_block, n_keys, 1, "ut") as t:
            p1 = ops.splat(b, load(b, scores, t))
            row = gep(b, v_head, b.mul(t, row_stride))
            with counted_loop(b, i64(0), head_dim, VEC, "cvt") as c:
                store(b, fmuladd(b, p1, load_half8(b, row, c, f16c), load(b, out_row, c, V8F32)), out_row, c)
        with counted_loop(b, i64(0), head_dim, VEC, "n") as c:
            store(b, b.fmul(load(b, out_row, c, V8F32), inv_l), out_row, c)
    b.ret_void()
    return module


def split_work(n_q: int, n_head: int, pos0: int, n_parts: int) -> list[tuple[int, int]]:
    """Cut the items w = query * n_head + head into <= n_parts contiguous ranges of ~equal cost.

    An item's cost is the number of keys it reads, pos0 + query + 1.
    """
    n_items = n_q * n_head
    if n_parts <= 1 or n_items <= 1:
        return [(0, n_items)]
    cost = np.cumsum(pos0 + 1 + np.arange(n_items) // n_head)  # [n_items]
    targets = cost[-1] * np.arange(1, n_parts) / n_parts
    cuts = [0, *(int(c) + 1 for c in np.searchsorted(cost, targets)), n_items]
    return [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def _check(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int) -> None:
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
    if not 0 <= pos0 or pos0 + n_q > n_ctx:
        raise ValueError(f"queries at positions {pos0}..{pos0 + n_q - 1} do not fit a cache of {n_ctx} rows")


class AttentionKernel:
    """Compiled causal GQA attention; see the module docstring. Safe to call from several threads."""

    # Below this many (key row x head_dim) products one thread wins: handing work to a pool
    # thread costs ~60 us here, as much as a 9-head decode step over 1300 cached rows.
    parallel_min_work = 1 << 21

    def __init__(self, n_threads: int = 1, *, f16c: bool | None = None) -> None:
        if n_threads < 1:
            raise ValueError(f"n_threads must be >= 1, got {n_threads}")
        self.n_threads = n_threads
        self.f16c = host_has("f16c") if f16c is None else f16c
        lib = compile_ir(str(build_attention_module(self.f16c)))
        p, n = ctypes.c_void_p, ctypes.c_int64
        self._fn = lib.function(FUNCTION, None, p, p, p, p, p, n, n, n, n, n, ctypes.c_float, n, n)
        self._pool = ThreadPoolExecutor(n_threads - 1, thread_name_prefix="attn") if n_threads > 1 else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __call__(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int,
                 out: np.ndarray | None = None, *, scale: float | None = None) -> np.ndarray:
        """q [n_q, n_head, head_dim] f32 at positions pos0.. -> [n_q, n_head, head_dim] f32.

        Query i sees cache rows 0 .. pos0 + i; head h reads kv head h // (n_head // n_kv_head).
        out may be q itself (but not overlap it partially). scale defaults to 1/sqrt(head_dim).
        """
        pos0 = operator.index(pos0)  # an int; a float position is a caller bug
        _check(q, k_cache, v_cache, pos0)
        n_q, n_head, head_dim = q.shape
        n_kv_head = k_cache.shape[1]
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
        stride = -(-(pos0 + n_q) // VEC) * VEC  # scores scratch per thread, whole vectors
        args = (ops.address(q), ops.address(k_cache), ops.address(v_cache), ops.address(out))
        sizes = (n_q, n_head, n_kv_head, head_dim, pos0, scale)
        work = n_head * head_dim * (n_q * pos0 + n_q * (n_q + 1) // 2)  # key-row x dim products
        if self._pool is None or work < self.parallel_min_work:
            scores = np.empty(stride, np.float32)
            self._fn(*args, ops.address(scores), *sizes, 0, n_items)
            return out
        parts = split_work(n_q, n_head, pos0, self.n_threads)
        scores = np.empty((len(parts), stride), np.float32)  # [part, key]
        base = ops.address(scores)
        futures = [self._pool.submit(self._fn, *args, base + 4 * stride * i, *sizes, lo, hi)
                   for i, (lo, hi) in enumerate(parts) if i > 0]
        self._fn(*args, base, *sizes, *parts[0])  # the calling thread takes the first share
        for f in futures:
            f.result()
        return out


def attention_reference(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int,
                        scale: float | None = None) -> np.ndarray:
    """The numpy twin, in float64: softmax(q k^T * scale + causal mask) v per head."""
    n_q, n_head, head_dim = q.shape
    n_kv_head = k_cache.shape[1]
    group = n_head // n_kv_head
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    n_keys = pos0 + n_q
    keys = k_cache[:n_keys].astype(np.float64)    # [n_keys, n_kv_head, head_dim]
    values = v_cache[:n_keys].astype(np.float64)  # [n_keys, n_kv_head, head_dim]
    kv_of_head = np.arange(n_head) // group
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), keys[:, kv_of_head]) * scale  # [n_head, n_q, n_keys]
    visible = np.arange(n_keys)[None, :] <= pos0 + np.arange(n_q)[:, None]  # [n_q, n_keys]
    s = np.where(visible[None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, values[:, kv_of_head]).astype(np.float32)
