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

Around it (the layer, engine/arch/qwen35.py): the causal conv over the q/k/v channels with
d_conv - 1 rows of state per sequence, SiLU, per-head L2 norms of q and k, and after the rule
an RMS norm per head gated by silu(z). The maths is float32 as llama.cpp's CPU path runs it;
tests/engine/test_delta_net.py holds both forms to a float64 transcription of the loop above.
"""
from __future__ import annotations

import numpy as np

CHUNK = 64  # tokens per chunk of the chunked form (llama.cpp's CS for scalar gates)


def causal_conv(x: np.ndarray, state: np.ndarray, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [n, C] new rows, state [d_conv - 1, C] the rows before them, kernel [C, d_conv]
    -> (out [n, C], the new state): out[t, c] = sum_i in[t + i, c] * kernel[c, i] over
    in = [state; x] (ggml_ssm_conv), no activation."""
    d = kernel.shape[1]
    xin = np.concatenate([state, x], axis=0)                      # [n + d - 1, C]
    n = x.shape[0]
    out = xin[0:n] * kernel[:, 0]
    for i in range(1, d):
        out += xin[i:i + n] * kernel[:, i]
    return out, np.ascontiguousarray(xin[n:])


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
              state: np.ndarray) -> np.ndarray:
    """The rule token by token. q, k [n, B, H, S_k], v [n, B, H, S_v], g, beta [n, B, H],
    state [B, H, S_v, S_k] (B sequences side by side, updated in place) -> o [n, B, H, S_v]."""
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
    diff = np.where(lower, G[:, :, None] - G[:, None, :], -np.inf)  # [H, t, j]: G_t - G_j
    decay = np.exp(diff).astype(np.float32)
    eG = np.exp(G)                                                # [H, L]
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


def _solve_unit_lower(A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """(I + A) u = rhs for A strictly lower triangular [H, L, L], by forward substitution
    (row t needs the rows before it: L small steps over all heads at once)."""
    u = np.empty_like(rhs)
    for t in range(A.shape[1]):
        u[:, t] = rhs[:, t] - np.einsum("hj,hjv->hv", A[:, t, :t], u[:, :t])
    return u
