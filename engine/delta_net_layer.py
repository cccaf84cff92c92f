"""One Gated DeltaNet sublayer over a forward call's chunks (llama.cpp's qwen35
build_layer_attn_linear), reading and writing each chunk's slot state (engine.recurrent).

    qkv = h @ Wqkv  [q (H_k * S); k (H_k * S); v (H_v * S)]     z = h @ Wgate  [H_v * S]
    beta = sigmoid(h @ Wbeta)       g = softplus(h @ Walpha + dt_bias) * A      [H_v] per token
    per chunk (one sequence):  qkv = silu(causal_conv(qkv; its conv state))
        q, k = l2_norm per head; value head j reads q/k head j % H_k; q *= 1/sqrt(S)
        o = delta rule (engine.kernels.delta_net) from its ssm state
    o = (rms_norm(o per head) * ssm_norm * silu(z)) @ Wout

Decode chunks (one token each) run together, their states side by side; a longer chunk runs
on its own, split at the positions its slot checkpoints. Both through the compiled conv and
rule (engine.kernels.delta_net).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .formats import quants
from .kernels import delta_net as dn
from .kernels import ops
from .recurrent import RecurrentState


@dataclass(frozen=True)
class DeltaNetWeights:
    qkv: quants.QuantMatrix     # [2 * H_k * S + H_v * S, n_embd]
    z: quants.QuantMatrix       # [H_v * S, n_embd]
    beta: quants.QuantMatrix    # [H_v, n_embd]
    alpha: quants.QuantMatrix   # [H_v, n_embd]
    conv: np.ndarray            # float32 [conv_dim, d_conv]
    dt_bias: np.ndarray         # float32 [H_v]
    a: np.ndarray               # float32 [H_v] (-exp(A_log))
    norm: np.ndarray            # float32 [S]
    out: quants.QuantMatrix     # [n_embd, H_v * S]


@dataclass(frozen=True)
class DeltaNetDims:
    k_heads: int   # H_k (ssm.group_count)
    v_heads: int   # H_v (ssm.time_step_rank)
    head: int      # S (ssm.state_size), keys and values alike
    eps: float
    threads: int = 1  # the rule's heads split between this many threads


@dataclass(frozen=True)
class ChunkRows:
    """One chunk of the call: its slot, its rows [a, b) and the checkpoints it takes
    (tokens into the chunk after which, entry: RecurrentState.plan)."""
    slot: int
    a: int
    b: int
    checkpoints: list[tuple[int, int]]


def delta_net_layer(mm: Callable[[quants.QuantMatrix, np.ndarray], np.ndarray], h: np.ndarray,
                    w: DeltaNetWeights, d: DeltaNetDims, state: RecurrentState, layer: int,
                    chunks: list[ChunkRows]) -> np.ndarray:
    """o [T, n_embd] of the sublayer for h [T, n_embd] (float32)."""
    T, Hv, S = h.shape[0], d.v_heads, d.head
    qkv = mm(w.qkv, h)                                                  # [T, conv_dim]
    z = mm(w.z, h)                                                      # [T, H_v * S]
    beta = dn.sigmoid(mm(w.beta, h))                                    # [T, H_v]
    g = (dn.softplus(mm(w.alpha, h) + w.dt_bias) * w.a).astype(np.float32)  # [T, H_v]
    li = state.index[layer]
    y = np.empty((T, Hv, S), np.float32)
    kernel_t = np.ascontiguousarray(w.conv.T)                          # [d_conv, conv_dim]
    decode = [c for c in chunks if c.b - c.a == 1 and not c.checkpoints]
    if decode:  # one token each: their states side by side, one call per kernel
        rows = np.array([c.a for c in decode])
        slots = np.array([c.slot for c in decode])
        conv = state.conv[slots, li]                                    # [B, d_conv - 1, C]
        mixed = dn.conv_silu(qkv[rows][:, None, :], conv, kernel_t)[:, 0]
        state.conv[slots, li] = conv
        q, k, v = _heads(mixed, d)                                      # [B, H_v, S]
        ssm = state.ssm[slots, li]                                      # [B, H_v, S, S]
        o = dn.recurrent(q[None], k[None], v[None], g[rows][None], beta[rows][None], ssm,
                         d.threads)[0]
        state.ssm[slots, li] = ssm
        y[rows] = o
    for c in chunks:
        if c.b - c.a == 1 and not c.checkpoints:
            continue
        at = 0
        for end, entry in [*c.checkpoints, (c.b - c.a, -1)]:
            if end > at:
                r = slice(c.a + at, c.a + end)
                y[r] = _run(qkv[r], g[r], beta[r], kernel_t, d, state, c.slot, li)
                at = end
            if entry >= 0:
                state.save(c.slot, entry, layer)
    normed = ops.rms_norm(y, w.norm, d.eps).reshape(T, Hv * S)
    return mm(w.out, np.ascontiguousarray(normed * dn.silu(z)))


def _run(qkv: np.ndarray, g: np.ndarray, beta: np.ndarray, kernel_t: np.ndarray,
         d: DeltaNetDims, state: RecurrentState, slot: int, li: int) -> np.ndarray:
    """Rows of one sequence from its live state (updated): the rule's output [n, H_v, S]."""
    mixed = dn.conv_silu(qkv[None], state.conv[slot, li][None], kernel_t)[0]  # state in place
    q, k, v = _heads(mixed, d)                                          # [n, H_v, S]
    ssm = state.ssm[slot, li][None]                                     # a view: updated in place
    return dn.recurrent(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], ssm,
                        d.threads)[:, 0]


def _heads(mixed: np.ndarray, d: DeltaNetDims) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[..., conv_dim] conv output -> q, k, v [..., H_v, S]: q and k L2-normed per head and
    tiled to the value heads (value head j reads head j % H_k), q scaled by 1/sqrt(S)."""
    Hk, Hv, S = d.k_heads, d.v_heads, d.head
    lead = mixed.shape[:-1]
    q = dn.l2_norm(mixed[..., :Hk * S].reshape(*lead, Hk, S), d.eps)
    k = dn.l2_norm(mixed[..., Hk * S:2 * Hk * S].reshape(*lead, Hk, S), d.eps)
    v = np.ascontiguousarray(mixed[..., 2 * Hk * S:].reshape(*lead, Hv, S))
    reps = Hv // Hk
    q = np.tile(q, (1,) * len(lead) + (reps, 1)) * np.float32(1.0 / np.sqrt(S))
    k = np.tile(k, (1,) * len(lead) + (reps, 1))
    return q.astype(np.float32), k, v
