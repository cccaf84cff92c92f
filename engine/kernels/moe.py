"""A mixture of experts' glue, compiled, each with a numpy twin: route, group, gather, combine.

    route(logits, k)            per token: p = softmax(logits over all experts), the k largest
                                p (ties: the lower expert), their weights p / sum of the k
    group(ids, n_expert)        the (token, choice) pairs sorted by expert, stably: each
                                expert's tokens become one contiguous run of rows
    gather(src, rows)           dst[p] = src[rows[p]]: a run's token rows side by side
    combine(eo, pos, weights)   out[t] = sum_j weights[t, j] * eo[pos[t, j]], j in order

Why grouped: a decode step or a prompt chunk runs each chosen expert's matrices once, as one
matmul over all of its tokens, and an expert no token chose is never read (qwen3moe's 30B
reads 3B of weights per token). The matmuls themselves are the ordinary kernels on one
expert's rows (a view of quants.StackedMatrix, or of formats.repack.RepackedStack for the
row-interleaved kernels); their inputs are quantized per run, whose packed
layout (engine.formats.activations) starts at a run's `padded` row: runs padded to 8 rows, so
a run's packed bytes never overlap the next run's.

The maths is llama.cpp's build_moe_ffn for softmax gating with norm_w: the softmax sums in
double as ggml's does, the renormalisation divides by the k weights' sum, the combine adds
the weighted expert outputs one after another.
"""
from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from engine.kernels.ir.builder import (
    F32,
    F32P,
    F64,
    I64,
    V8F32,
    address,
    const,
    counted_loop,
    define,
    elementwise,
    exp,
    gep,
    i64,
    load,
    maxnum,
    new_module,
    splat,
    store,
    variable,
)
from engine.kernels.jit import CompiledLibrary, compile_cached

I64P = I64.as_pointer()
PAD_ROWS = 8  # a run's packed activations start on a multiple of 8 rows (the scale groups)


def take_top_k(b: ir.IRBuilder, row: ir.Value, n_exp: ir.Value, k: ir.Value, ids_row: ir.Value,
               w_row: ir.Value, best: ir.Value, best_v: ir.Value,
               on_pick: Callable[[], None] | None = None) -> None:
    """ids_row[j], w_row[j] = the j-th largest of row[:n_exp] and its index, for j < k, the
    lower index first among equals (ggml's argsort); each pick is overwritten with -inf in row.
    `best`, `best_v`: the caller's i64 and f32 variables (the pick, after each); on_pick() runs
    after each pick."""
    with counted_loop(b, i64(0), k, 1, "j") as j:
        b.store(i64(0), best)
        b.store(const(F32, -math.inf), best_v)
        with counted_loop(b, i64(0), n_exp, 1, "s") as e:
            v = load(b, row, e)
            better = b.fcmp_ordered(">", v, b.load(best_v))
            b.store(b.select(better, e, b.load(best)), best)
            b.store(b.select(better, v, b.load(best_v)), best_v)
        store(b, b.load(best), ids_row, j)
        store(b, b.load(best_v), w_row, j)
        store(b, const(F32, -math.inf), row, b.load(best))  # taken
        if on_pick is not None:
            on_pick()


def _build_route(module: ir.Module) -> None:
    # void moe_route(float* logits [M, E] (overwritten), i64* ids [M, k], float* w [M, k],
    #                i64 M, i64 E, i64 k)
    b, (logits, ids, w, n_rows, n_exp, k) = define(module, "moe_route", ir.VoidType(), [
        ("logits", F32P), ("ids", I64P), ("w", F32P), ("n_rows", I64), ("n_exp", I64),
        ("k", I64)])
    mx = variable(b, F32, const(F32, -math.inf), "mx")
    total = variable(b, F64, const(F64, 0.0), "total")
    best = variable(b, I64, i64(0), "best")
    best_p = variable(b, F32, const(F32, -math.inf), "best_p")
    chosen = variable(b, F64, const(F64, 0.0), "chosen")
    with counted_loop(b, i64(0), n_rows, 1, "m") as m:
        row = gep(b, logits, b.mul(m, n_exp))
        ids_row, w_row = gep(b, ids, b.mul(m, k)), gep(b, w, b.mul(m, k))
        b.store(const(F32, -math.inf), mx)
        with counted_loop(b, i64(0), n_exp, 1, "e") as e:
            b.store(maxnum(b, b.load(mx), load(b, row, e)), mx)
        b.store(const(F64, 0.0), total)
        with counted_loop(b, i64(0), n_exp, 1, "x") as e:
            p = exp(b, b.fsub(load(b, row, e), b.load(mx)))
            store(b, p, row, e)
            b.store(b.fadd(b.load(total), b.fpext(p, F64)), total)
        inv = b.fptrunc(b.fdiv(const(F64, 1.0), b.load(total)), F32)
        with counted_loop(b, i64(0), n_exp, 1, "n") as e:
            store(b, b.fmul(load(b, row, e), inv), row, e)
        b.store(const(F64, 0.0), chosen)
        take_top_k(b, row, n_exp, k, ids_row, w_row, best, best_p, on_pick=lambda: b.store(
            b.fadd(b.load(chosen), b.fpext(b.load(best_p), F64)), chosen))
        weight_sum = b.fptrunc(b.load(chosen), F32)
        with counted_loop(b, i64(0), k, 1, "r") as j:
            store(b, b.fdiv(load(b, w_row, j), weight_sum), w_row, j)
    b.ret_void()


def _build_group(module: ir.Module) -> None:
    # void moe_group(i64* ids [P], i64 P, i64 E, i64 k, i64* offsets [E + 1],
    #                i64* padded [E + 1], i64* rows [P], i64* pos [P])
    # offsets: expert e's run is grouped rows [offsets[e], offsets[e + 1]); rows[q]: the token
    # of grouped row q; pos[p]: the grouped row of pair p (= token * k + choice); padded[e]:
    # where run e's packed activations start, in rows (runs rounded up to PAD_ROWS).
    b, (ids, n_pairs, n_exp, k, offsets, padded, rows, pos) = define(
        module, "moe_group", ir.VoidType(), [
            ("ids", I64P), ("n_pairs", I64), ("n_exp", I64), ("k", I64), ("offsets", I64P),
            ("padded", I64P), ("rows", I64P), ("pos", I64P)])
    with counted_loop(b, i64(0), b.add(n_exp, i64(1)), 1, "z") as e:
        store(b, i64(0), offsets, e)
    with counted_loop(b, i64(0), n_pairs, 1, "c") as p:  # counts, at offsets[e + 1]
        slot = gep(b, offsets, b.add(load(b, ids, p, I64), i64(1)))
        b.store(b.add(b.load(slot), i64(1)), slot)
    with counted_loop(b, i64(0), n_exp, 1, "s") as e:  # offsets[e + 1] = end of run e
        nxt = gep(b, offsets, b.add(e, i64(1)))
        b.store(b.add(b.load(nxt), load(b, offsets, e, I64)), nxt)
    with counted_loop(b, i64(0), n_pairs, 1, "f") as p:  # offsets[e] walks run e
        slot = gep(b, offsets, load(b, ids, p, I64))
        q = b.load(slot)
        store(b, b.sdiv(p, k), rows, q)
        store(b, q, pos, p)
        b.store(b.add(q, i64(1)), slot)
    with counted_loop(b, i64(0), n_exp, 1, "u") as i:  # back: offsets[e] = start of run e
        e = b.sub(n_exp, i)
        store(b, load(b, offsets, b.sub(e, i64(1)), I64), offsets, e)
    store(b, i64(0), offsets, i64(0))
    store(b, i64(0), padded, i64(0))
    with counted_loop(b, i64(0), n_exp, 1, "q") as e:
        n = b.sub(load(b, offsets, b.add(e, i64(1)), I64), load(b, offsets, e, I64))
        n = b.and_(b.add(n, i64(PAD_ROWS - 1)), i64(-PAD_ROWS))
        store(b, b.add(load(b, padded, e, I64), n), padded, b.add(e, i64(1)))
    b.ret_void()


def _build_gather(module: ir.Module) -> None:
    # void moe_gather(float* src [T, n], i64* rows [P], float* dst [P, n], i64 p0, i64 p1, i64 n)
    b, (src, rows, dst, p0, p1, n) = define(module, "moe_gather", ir.VoidType(), [
        ("src", F32P), ("rows", I64P), ("dst", F32P), ("p0", I64), ("p1", I64), ("n", I64)])
    with counted_loop(b, p0, p1, 1, "p") as p:
        s = gep(b, src, b.mul(load(b, rows, p, I64), n))
        d = gep(b, dst, b.mul(p, n))
        elementwise(b, n, lambda j, ty: store(b, load(b, s, j, ty), d, j))
    b.ret_void()


def _build_combine(module: ir.Module) -> None:
    # void moe_combine(float* eo [P, n], i64* pos [M, k], float* w [M, k], float* out [M, n],
    #                  i64 M, i64 n, i64 k)
    b, (eo, pos, w, out, n_rows, n, k) = define(module, "moe_combine", ir.VoidType(), [
        ("eo", F32P), ("pos", I64P), ("w", F32P), ("out", F32P), ("n_rows", I64), ("n", I64),
        ("k", I64)])

    def weighted(t: ir.Value, j: ir.Value) -> tuple[ir.Value, ir.Value]:
        pair = b.add(b.mul(t, k), j)
        return gep(b, eo, b.mul(load(b, pos, pair, I64), n)), load(b, w, pair)

    def scaled(row: ir.Value, c: ir.Value, j: ir.Value, ty: ir.Type) -> ir.Value:
        return b.fmul(load(b, row, j, ty), splat(b, c) if ty is V8F32 else c)

    with counted_loop(b, i64(0), n_rows, 1, "t") as t:
        orow = gep(b, out, b.mul(t, n))
        row0, c0 = weighted(t, i64(0))
        elementwise(b, n, lambda j, ty: store(b, scaled(row0, c0, j, ty), orow, j))
        with counted_loop(b, i64(1), k, 1, "j") as jj:
            row, c = weighted(t, jj)
            elementwise(b, n, lambda j, ty: store(
                b, b.fadd(load(b, orow, j, ty), scaled(row, c, j, ty)), orow, j))
    b.ret_void()


def build_moe_module() -> ir.Module:
    module = new_module("moe")
    _build_route(module)
    _build_group(module)
    _build_gather(module)
    _build_combine(module)
    return module


NAMES = ("moe_route", "moe_group", "moe_gather", "moe_combine")


class _MoE:
    """The compiled functions (ctypes handles and addresses for task graphs), loaded once."""

    def __init__(self) -> None:
        lib: CompiledLibrary = compile_cached("moe", (), lambda: str(build_moe_module()))
        p, n = ctypes.c_void_p, ctypes.c_int64
        self.route = lib.function("moe_route", None, p, p, p, n, n, n)
        self.group = lib.function("moe_group", None, p, n, n, n, p, p, p, p)
        self.gather = lib.function("moe_gather", None, p, p, p, n, n, n)
        self.combine = lib.function("moe_combine", None, p, p, p, p, n, n, n)
        self.address = {name: lib.address(name) for name in NAMES}


_moe: _MoE | None = None
_moe_lock = threading.Lock()


def load_moe() -> _MoE:
    """Compile (or load from the disk cache) the MoE glue; call at model load."""
    global _moe
    with _moe_lock:
        if _moe is None:
            _moe = _MoE()
        return _moe


# ---------------------------------------------------------------------------------------------
# Facades (the eager path and the tests) and their numpy twins
# ---------------------------------------------------------------------------------------------

def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def route(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 [T, E] router logits -> (ids int64 [T, k], weights float32 [T, k])."""
    x = np.array(logits, dtype=np.float32, order="C")  # a copy: the kernel works in place
    n_tokens, n_exp = x.shape
    if not 0 < k <= n_exp:
        raise ValueError(f"cannot choose {k} of {n_exp} experts")
    ids = np.empty((n_tokens, k), np.int64)
    w = np.empty((n_tokens, k), np.float32)
    if n_tokens:
        load_moe().route(address(x), address(ids), address(w), n_tokens, n_exp, k)
    return ids, w


def route_reference(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=-1)
    return ids.astype(np.int64), (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)


def group(ids: np.ndarray, n_exp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """int64 [T, k] choices -> (offsets [E + 1], padded [E + 1], rows [T * k], pos [T, k])."""
    flat = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    if flat.size and not (flat.min() >= 0 and flat.max() < n_exp):
        raise ValueError(f"expert ids must lie in [0, {n_exp})")
    offsets, padded = np.empty(n_exp + 1, np.int64), np.empty(n_exp + 1, np.int64)
    rows, pos = np.empty(flat.size, np.int64), np.empty(flat.size, np.int64)
    load_moe().group(address(flat), flat.size, n_exp, ids.shape[-1], address(offsets),
                     address(padded), address(rows), address(pos))
    return offsets, padded, rows, pos.reshape(ids.shape)


def group_reference(ids: np.ndarray, n_exp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")                  # grouped row q -> pair
    counts = np.bincount(flat, minlength=n_exp)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    padded = np.concatenate([[0], np.cumsum(-(-counts // PAD_ROWS) * PAD_ROWS)])
    pos = np.empty_like(order)
    pos[order] = np.arange(order.size)
    return offsets, padded, order // ids.shape[-1], pos.reshape(ids.shape)


def gather(src: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """dst[p] = src[rows[p]] for float32 src [T, n]."""
    src = _f32(src)
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.size and not (rows.min() >= 0 and rows.max() < src.shape[0]):
        raise ValueError("a row index is outside src")
    dst = np.empty((rows.size, src.shape[1]), np.float32)
    load_moe().gather(address(src), address(rows), address(dst), 0, rows.size, src.shape[1])
    return dst


def combine(eo: np.ndarray, pos: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """float32 [T, n]: out[t] = sum_j weights[t, j] * eo[pos[t, j]], summed j = 0, 1, ..."""
    eo, weights = _f32(eo), _f32(weights)
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    if pos.shape != weights.shape or (pos.size and not (pos.min() >= 0 and pos.max() < eo.shape[0])):
        raise ValueError("pos and weights must be [T, k] with rows of eo")
    out = np.empty((pos.shape[0], eo.shape[1]), np.float32)
    if out.size:
        load_moe().combine(address(eo), address(pos), address(weights), address(out),
                           pos.shape[0], eo.shape[1], pos.shape[1])
    return out


def combine_reference(eo: np.ndarray, pos: np.ndarray, weights: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.einsum("tkn,tk->tn", eo.astype(np.float64)[pos], weights)
    return out.astype(np.float32)
