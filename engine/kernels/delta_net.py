"""Gated DeltaNet (Qwen3.5's linear-attention layers): the short causal conv and the delta rule.

One head's state is a matrix S [S_v, S_k] that every token updates and reads:

    S  = exp(g_t) * S                       decay (g_t <= 0: softplus(alpha + dt_bias) * A)
    S += beta_t * (v_t - S k_t) k_t^T       the delta rule: S k_t moves toward v_t
    o_t = S q_t                             (q_t already scaled by 1/sqrt(S_k))

llama.cpp's build_delta_net_autoregressive (src/models/delta-net-base.cpp) step for step.
Two forms give the same outputs and final state:
  - `recurrent`: the loop above, one token after another; decode steps of many sequences at
    once (their states gathered side by side), and the exact form any prompt can run.
  - `chunked`: the prompt form. Within a chunk of L tokens, with G_t the cumulative decay
    from the chunk's start, S0 the state before it and u_t = beta_t (v_t - S_t^pre k_t) the
    value each token writes (S_t^pre: the decayed state it sees):
        u = (I + A)^-1 (beta * (v - exp(G) * (S0 k)))      A_tj = beta_t e^(G_t - G_j) k_t.k_j, j < t
        o_t = e^(G_t) S0 q_t + sum_{j <= t} e^(G_t - G_j) (k_j.q_t) u_j
        S_L = e^(G_L) S0 + sum_j e^(G_L - G_j) u_j k_j^T
    i.e. a triangular solve and a few [L, L] and [L, S] matrix products per chunk and head,
    instead of L rank-one updates of S (llama.cpp's build_delta_net_chunking, chunks of 64).

`recurrent` is compiled (LLVM IR, one call per run of tokens: every head's rows of S decayed,
read against k, updated and read against q in two passes over S, ROWS rows side by side so
their sums are independent chains) with `recurrent_reference`,
the numpy loop, as its twin; `chunked` is numpy (its work is batched matrix products).

Around it (the layer, engine/delta_net_layer.py): the causal conv over the q/k/v channels with
d_conv - 1 rows of state per sequence, SiLU, per-head L2 norms of q and k, and after the rule
an RMS norm per head gated by silu(z). The maths is float32 as llama.cpp's CPU path runs it;
tests/engine/test_delta_net.py holds both forms to a float64 transcription of the loop above.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from llvmlite import ir

from engine.kernels.ir.builder import (
    F32,
    F32P,
    I64,
    V8F32,
    address,
    const,
    counted_loop,
    define,
    elementwise,
    exp,
    fmuladd,
    gep,
    hsum,
    i64,
    load,
    new_module,
    splat,
    store,
    variable,
)
from engine.kernels.jit import CompiledLibrary, compile_cached

CHUNK = 64  # tokens per chunk of the chunked form (llama.cpp's CS for scalar gates)
SPLIT_WORK = 1 << 22  # state floats a rule call touches before its heads are split between
#                      threads (a hand-off costs ~0.1-0.5 ms; a decode step of Qwen3.5-0.8B's
#                      16 heads of 128 touches 0.26 M, ~0.1 ms on one thread)
ROWS = 4  # state rows the compiled rule updates side by side (independent sums)
FLUSH = -30.0  # log-decays below this count as 0 in the chunked form (_exp_or_zero)


def conv_silu(x: np.ndarray, state: np.ndarray, kernel_t: np.ndarray) -> np.ndarray:
    """silu of the causal conv, compiled. x float32 [B, n, C] new rows of B sequences, state
    [B, d_conv - 1, C] the rows before them (then the last d_conv - 1 rows of [state; x], in
    place), kernel_t [d_conv, C] (the file's [C, d_conv] transposed) -> out [B, n, C]:
    silu(sum_i in[t + i] * kernel_t[i]) over in = [state; x] (ggml_ssm_conv, then SiLU)."""
    B, n, C = x.shape
    d = kernel_t.shape[0]
    if state.shape != (B, d - 1, C) or kernel_t.shape != (d, C):
        raise ValueError(f"state must be {(B, d - 1, C)} and kernel_t {(d, C)}")
    for a, what in ((state, "state"), (kernel_t, "kernel_t")):
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            raise ValueError(f"{what} must be C-contiguous float32")
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    if out.size:
        load_delta_net().conv(address(x), address(state), address(kernel_t), address(out), B, n,
                              C, d)
    return out


def conv_silu_reference(x: np.ndarray, state: np.ndarray, kernel_t: np.ndarray) -> np.ndarray:
    """`conv_silu`'s numpy twin (same shapes; state updated in place)."""
    d, n = kernel_t.shape[0], x.shape[1]
    xin = np.concatenate([state, x], axis=1)                      # [B, n + d - 1, C]
    out = xin[:, 0:n] * kernel_t[0]
    for i in range(1, d):
        out += xin[:, i:i + n] * kernel_t[i]
    state[...] = xin[:, n:]
    return silu(out)


def silu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x / (np.float32(1.0) + np.exp(-x))
    return out


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), x itself above 20 (ggml's op_softplus)."""
    out: np.ndarray = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    return out.astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.float32(1.0) / (np.float32(1.0) + np.exp(-x))
    return out.astype(np.float32)


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis (llama.cpp's build_gdn_l2_norm)."""
    out: np.ndarray = x / np.sqrt((x * x).sum(-1, keepdims=True) + np.float32(eps))
    return out.astype(np.float32)


def recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
              state: np.ndarray, threads: int = 1) -> np.ndarray:
    """The rule token by token, compiled. q, k [n, B, H, S_k], v [n, B, H, S_v], g, beta
    [n, B, H], state [B, H, S_v, S_k] (B sequences side by side, C-contiguous float32, updated
    in place) -> o [n, B, H, S_v]. threads > 1: the heads split between that many calls at
    once when the call is large enough (SPLIT_WORK; each head's state is its own, and ctypes
    lets go of the GIL during a call)."""
    n, B, H, S = q.shape
    if k.shape != q.shape or v.shape != q.shape or g.shape != (n, B, H) or beta.shape != g.shape:
        raise ValueError("q, k, v must be [n, B, H, S] and g, beta [n, B, H] alike")
    if state.shape != (B, H, S, S) or state.dtype != np.float32 or not state.flags.c_contiguous:
        raise ValueError(f"state must be C-contiguous float32 {(B, H, S, S)}")
    q, k, v, g, beta = (np.ascontiguousarray(a, np.float32) for a in (q, k, v, g, beta))
    o = np.empty(v.shape, np.float32)
    if not o.size:
        return o
    rule, heads = load_delta_net().rule, B * H
    args = (address(q), address(k), address(v), address(g), address(beta), address(state),
            address(o), n, heads, S)
    parts = max(1, min(threads, heads)) if n * heads * S * S >= SPLIT_WORK else 1
    bounds = [heads * i // parts for i in range(parts + 1)]
    if parts == 1:
        rule(*args, 0, heads)
    else:
        list(_executor(parts).map(lambda i: rule(*args, bounds[i], bounds[i + 1]), range(parts)))
    return o


def recurrent_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                        beta: np.ndarray, state: np.ndarray) -> np.ndarray:
    """`recurrent`'s numpy twin (same shapes; state updated in place)."""
    o = np.empty(v.shape, np.float32)
    for t in range(q.shape[0]):
        state *= np.exp(g[t])[..., None, None]
        sk = np.einsum("bhvk,bhk->bhv", state, k[t])
        d = (v[t] - sk) * beta[t][..., None]
        state += d[..., :, None] * k[t][..., None, :]
        o[t] = np.einsum("bhvk,bhk->bhv", state, q[t])
    return o


def chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
            state: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """The same rule for one sequence a chunk at a time. q, k [n, H, S_k], v [n, H, S_v],
    g, beta [n, H], state [H, S_v, S_k] (updated in place) -> o [n, H, S_v]."""
    n, H, S_v = v.shape
    o = np.empty((n, H, S_v), np.float32)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        o[a:b] = _one_chunk(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], state)
    return o


def _one_chunk(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
               state: np.ndarray) -> np.ndarray:
    L = q.shape[0]
    qh, kh, vh = (np.ascontiguousarray(a.transpose(1, 0, 2)) for a in (q, k, v))  # [H, L, S]
    G = np.cumsum(g.T, axis=1, dtype=np.float32)                  # [H, L] decay since the start
    bh = beta.T                                                   # [H, L]
    lower = np.tril(np.ones((L, L), bool))                        # j <= t
    diff = G[:, :, None] - G[:, None, :]                          # [H, t, j]: G_t - G_j
    decay = _exp_or_zero(np.where(lower, diff, -np.inf))
    eG = _exp_or_zero(G)                                          # [H, L]
    kk = kh @ kh.transpose(0, 2, 1)                               # [H, t, j] k_t . k_j
    A = np.where(lower & ~np.eye(L, dtype=bool), bh[:, :, None] * decay * kk, 0).astype(np.float32)
    s0k = kh @ state.transpose(0, 2, 1)                           # [H, L, S_v] S0 k_t
    rhs = bh[:, :, None] * (vh - eG[:, :, None] * s0k)
    u = _solve_unit_lower(A, rhs)                                 # [H, L, S_v]
    qk = qh @ kh.transpose(0, 2, 1)                               # [H, t, j] q_t . k_j
    out = eG[:, :, None] * (qh @ state.transpose(0, 2, 1)) + (decay * qk) @ u
    last = decay[:, -1, :]                                        # [H, j] e^(G_L - G_j)
    state *= eG[:, -1][:, None, None]
    state += (u * last[:, :, None]).transpose(0, 2, 1) @ kh
    result: np.ndarray = out.transpose(1, 0, 2).astype(np.float32)
    return result


def _exp_or_zero(x: np.ndarray) -> np.ndarray:
    """exp(x), 0 where x < FLUSH: a decay of e^-30 is below float32's resolution next to the
    terms it is added to, and the smaller ones would be subnormal floats, which x86 multiplies
    some hundred times slower (a 64-token chunk took 0.5 s instead of a few ms)."""
    out: np.ndarray = np.exp(np.where(x < FLUSH, -np.inf, x)).astype(np.float32)
    return out


def _solve_unit_lower(A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """(I + A) u = rhs for A strictly lower triangular [H, L, L], by forward substitution
    (row t needs the rows before it: L small steps over all heads at once)."""
    u = np.empty_like(rhs)
    for t in range(A.shape[1]):
        u[:, t] = rhs[:, t] - np.einsum("hj,hjv->hv", A[:, t, :t], u[:, :t])
    return u


# ---------------------------------------------------------------------------------------------
# The compiled rule
# ---------------------------------------------------------------------------------------------

def _build_rule(module: ir.Module) -> None:
    # void delta_rule(float* q [n, H, S], float* k, float* v, float* g [n, H], float* beta,
    #                 float* state [H, S, S] (row j: value j, columns: keys), float* out [n, H, S],
    #                 i64 n, i64 H, i64 S, i64 h0, i64 h1): heads [h0, h1) only
    # per token t and head h, per state row j (two passes over it):
    #   row *= e^g; sk = row . k          d = (v_j - sk) * beta
    #   row += d * k; out_j = row . q
    b, (q, k, v, g, beta, state, out, n, n_head, S, h0, h1) = define(
        module, "delta_rule", ir.VoidType(), [
            ("q", F32P), ("k", F32P), ("v", F32P), ("g", F32P), ("beta", F32P),
            ("state", F32P), ("out", F32P), ("n", I64), ("n_head", I64), ("S", I64),
            ("h0", I64), ("h1", I64)])
    accs = [(variable(b, V8F32, splat(b, const(F32, 0.0)), f"acc_v{r}"),
             variable(b, F32, const(F32, 0.0), f"acc_s{r}")) for r in range(ROWS)]

    def dot_pass(body: Callable[[ir.Value, ir.Type], list[ir.Value]], rows: int) -> list[ir.Value]:
        """Run body(i, ty) -> per row the lanes to sum, over the S columns of `rows` rows at
        once (their sums are independent chains, which keep the adders busy); their sums."""
        for acc_v, acc_s in accs[:rows]:
            b.store(splat(b, const(F32, 0.0)), acc_v)
            b.store(const(F32, 0.0), acc_s)

        def step(i: ir.Value, ty: ir.Type) -> None:
            for part, (acc_v, acc_s) in zip(body(i, ty), accs):
                acc = acc_v if ty is V8F32 else acc_s
                b.store(b.fadd(b.load(acc), part), acc)
        elementwise(b, S, step)
        return [b.fadd(hsum(b, b.load(acc_v)), b.load(acc_s)) for acc_v, acc_s in accs[:rows]]

    def update_rows(rows: list[ir.Value], j: ir.Value, kr: ir.Value, qr: ir.Value, vr: ir.Value,
                    orow: ir.Value, decay: ir.Value, bt: ir.Value) -> None:
        """The rule on state rows j, j + 1, ... (len(rows) of them) for one token."""
        def decay_dot(i: ir.Value, ty: ir.Type) -> list[ir.Value]:
            c = splat(b, decay) if ty is V8F32 else decay
            kv = load(b, kr, i, ty)
            parts = []
            for row in rows:
                r = b.fmul(load(b, row, i, ty), c)
                store(b, r, row, i)
                parts.append(b.fmul(r, kv))
            return parts
        sks = dot_pass(decay_dot, len(rows))
        ds = [b.fmul(b.fsub(load(b, vr, b.add(j, i64(r))), sk), bt) for r, sk in enumerate(sks)]

        def update_dot(i: ir.Value, ty: ir.Type) -> list[ir.Value]:
            kv, qv = load(b, kr, i, ty), load(b, qr, i, ty)
            parts = []
            for row, d in zip(rows, ds):
                r = fmuladd(b, kv, splat(b, d) if ty is V8F32 else d, load(b, row, i, ty))
                store(b, r, row, i)
                parts.append(b.fmul(r, qv))
            return parts
        for r, o in enumerate(dot_pass(update_dot, len(rows))):
            store(b, o, orow, b.add(j, i64(r)))

    with counted_loop(b, i64(0), n, 1, "t") as t, counted_loop(b, h0, h1, 1, "h") as h:
        th = b.add(b.mul(t, n_head), h)
        vec = b.mul(th, S)
        qr, kr, vr, orow = gep(b, q, vec), gep(b, k, vec), gep(b, v, vec), gep(b, out, vec)
        decay = exp(b, load(b, g, th))
        bt = load(b, beta, th)
        st = gep(b, state, b.mul(b.mul(h, S), S))
        blocks = b.and_(S, i64(-ROWS))
        with counted_loop(b, i64(0), blocks, ROWS, "j") as j:   # ROWS rows at a time
            row0 = gep(b, st, b.mul(j, S))
            update_rows([gep(b, row0, b.mul(i64(r), S)) for r in range(ROWS)], j, kr, qr, vr,
                        orow, decay, bt)
        with counted_loop(b, blocks, S, 1, "jt") as j:          # the last S % ROWS rows
            update_rows([gep(b, st, b.mul(j, S))], j, kr, qr, vr, orow, decay, bt)
    b.ret_void()


def _build_conv(module: ir.Module) -> None:
    # void conv_silu(float* x [B, n, C], float* state [B, d - 1, C], float* kt [d, C],
    #                float* out [B, n, C], i64 B, i64 n, i64 C, i64 d)
    # row r of in = [state; x] is state's row r for r < d - 1, else x's row r - (d - 1)
    b, (x, state, kt, out, n_seq, n, C, d) = define(module, "conv_silu", ir.VoidType(), [
        ("x", F32P), ("state", F32P), ("kt", F32P), ("out", F32P), ("n_seq", I64), ("n", I64),
        ("C", I64), ("d", I64)])
    held = b.sub(d, i64(1))

    def in_row(xs: ir.Value, ss: ir.Value, r: ir.Value) -> ir.Value:
        from_state = b.icmp_signed("<", r, held)
        return b.select(from_state, gep(b, ss, b.mul(r, C)), gep(b, xs, b.mul(b.sub(r, held), C)))

    with counted_loop(b, i64(0), n_seq, 1, "s") as sq:
        xs = gep(b, x, b.mul(b.mul(sq, n), C))
        ss = gep(b, state, b.mul(b.mul(sq, held), C))
        os_ = gep(b, out, b.mul(b.mul(sq, n), C))
        with counted_loop(b, i64(0), n, 1, "t") as t:
            orow = gep(b, os_, b.mul(t, C))
            row0 = in_row(xs, ss, t)
            elementwise(b, C, lambda j, ty: store(b, b.fmul(load(b, row0, j, ty), load(b, kt, j, ty)),
                                                  orow, j))
            with counted_loop(b, i64(1), d, 1, "i") as i:
                row, krow = in_row(xs, ss, b.add(t, i)), gep(b, kt, b.mul(i, C))
                elementwise(b, C, lambda j, ty: store(b, fmuladd(
                    b, load(b, row, j, ty), load(b, krow, j, ty), load(b, orow, j, ty)), orow, j))

            def silu_at(j: ir.Value, ty: ir.Type) -> None:
                v = load(b, orow, j, ty)
                one = splat(b, const(F32, 1.0)) if ty is V8F32 else const(F32, 1.0)
                store(b, b.fdiv(v, b.fadd(one, exp(b, b.fsub(const(ty, 0.0), v)))), orow, j)
            elementwise(b, C, silu_at)
        with counted_loop(b, i64(0), held, 1, "k") as k:  # state = in's last d - 1 rows
            src, dst = in_row(xs, ss, b.add(n, k)), gep(b, ss, b.mul(k, C))
            elementwise(b, C, lambda j, ty: store(b, load(b, src, j, ty), dst, j))
    b.ret_void()


def build_delta_net_module() -> ir.Module:
    module = new_module("delta_net")
    _build_rule(module)
    _build_conv(module)
    return module


class _DeltaNet:
    """The compiled rule (a ctypes handle), loaded once."""

    def __init__(self) -> None:
        lib: CompiledLibrary = compile_cached("delta_net", (), lambda: str(build_delta_net_module()))
        p, n = ctypes.c_void_p, ctypes.c_int64
        self.rule = lib.function("delta_rule", None, p, p, p, p, p, p, p, n, n, n, n, n)
        self.conv = lib.function("conv_silu", None, p, p, p, p, n, n, n, n)


_delta_net: _DeltaNet | None = None
_lock = threading.Lock()
_executors: dict[int, ThreadPoolExecutor] = {}


def _executor(threads: int) -> ThreadPoolExecutor:
    """Threads that run parts of one rule call at once (kept for the process)."""
    with _lock:
        pool = _executors.get(threads)
        if pool is None:
            pool = _executors[threads] = ThreadPoolExecutor(threads, thread_name_prefix="delta-rule")
        return pool


def load_delta_net() -> _DeltaNet:
    """Compile (or load from the disk cache) the rule; the first call does it."""
    global _delta_net
    with _lock:
        if _delta_net is None:
            _delta_net = _DeltaNet()
        return _delta_net
