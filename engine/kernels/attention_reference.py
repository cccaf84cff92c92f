"""The numpy twins of the attention kernels (engine.kernels.attention), what the tests trust.

attention_reference picks between them as AttentionKernel picks its functions: the blocked f32
online softmax from TILED_MIN_QUERIES queries (the exact softmax, in float64, for a head_dim not
a multiple of 16), the f16-accumulator online softmax below, and
llama.cpp's non-flash path (q and p rounded to f16) when flash attention is off. `sinks`
(float32 [n_head], gpt-oss) is one more logit per head in the softmax, with a value of 0.
"""
from __future__ import annotations

import math

import numpy as np

from engine.kernels.attention_ir import TILE_KEYS, takes_tiles


def attention_reference(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int,
                        scale: float | None = None, window: int = 0,
                        softcap: float = 0.0, flash_attn: bool = True,
                        ring: int | None = None, sinks: np.ndarray | None = None,
    bidirectional: tuple[int, int] | None = None) -> np.ndarray:
    """The numpy twin of AttentionKernel: the same switch between its functions."""
    if not flash_attn:
        return attention_rounded_reference(q, k_cache, v_cache, pos0, scale, window, softcap, ring,
                                           sinks, bidirectional)
    tiled = takes_tiles(q.shape[0], pos0)
    if tiled and q.shape[2] % 16 == 0:
        return attention_blocked_reference(q, k_cache, v_cache, pos0, scale, window, softcap,
                                           ring, sinks, bidirectional)
    if tiled:
        return attention_exact(q, k_cache, v_cache, pos0, scale, window, softcap, ring, sinks,
                               bidirectional)
    return attention_f16acc_reference(q, k_cache, v_cache, pos0, scale, window, softcap, ring,
                                      sinks, bidirectional)


def _visible_keys(n_q: int, pos0: int, n_rows: int, window: int,
                  bidirectional: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(key positions still in the cache [n_keys], visible [n_q, n_keys]): query i at pos0 + i
    sees keys at p <= pos0 + i, the last `window` of them when window > 0; key p is row p % n_rows
    (the twins read a ring's primary rows, never its mirror). bidirectional (a, b): queries
    a <= i < b also see the keys after them up to position pos0 + b - 1 (llama.cpp's mask
    without causal attention: the window still only drops keys too far back)."""
    last = pos0 + n_q
    keys = np.arange(max(0, last - n_rows), last)                   # [n_keys]
    query = pos0 + np.arange(n_q)[:, None]                          # [n_q, 1]
    visible = keys[None, :] <= query
    if bidirectional is not None:
        a, b = bidirectional
        inside = (np.arange(n_q)[:, None] >= a) & (np.arange(n_q)[:, None] < b)   # [n_q, 1]
        visible |= inside & (keys[None, :] < pos0 + b)
    if window:
        visible &= query - keys[None, :] < window
    return keys, visible


def _cap(s: np.ndarray, softcap: float) -> np.ndarray:
    return s if not softcap else (softcap * np.tanh(s / softcap)).astype(s.dtype)


def attention_f16acc_reference(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                               pos0: int, scale: float | None = None, window: int = 0,
                               softcap: float = 0.0,
    ring: int | None = None, sinks: np.ndarray | None = None,
    bidirectional: tuple[int, int] | None = None) -> np.ndarray:
    """Twin of the f16-accumulator function: online softmax with its f16 roundings, key by key.

    Vectorised over (query, head) items; float32 like the kernel, so the two agree to float
    rounding in the dot products and exp.
    """
    n_q, n_head, head_dim = q.shape
    n_kv_head = k_cache.shape[1]
    kv_of_head = np.arange(n_head) // (n_head // n_kv_head)
    scale32 = np.float32(1.0 / math.sqrt(head_dim) if scale is None else scale)
    q16 = q.astype(np.float16).astype(np.float32)                 # [n_q, n_head, head_dim]
    acc = np.zeros((n_q, n_head, head_dim), np.float32)           # f16-representable values
    m = np.full((n_q, n_head), -np.inf, np.float32)
    l = np.zeros((n_q, n_head), np.float32)
    keys, visible = _visible_keys(n_q, pos0, ring or k_cache.shape[0], window, bidirectional)
    for t, p in enumerate(keys):
        row = p % (ring or k_cache.shape[0])
        k = k_cache[row, kv_of_head].astype(np.float32)           # [n_head, head_dim]
        v = v_cache[row, kv_of_head].astype(np.float32)
        s = _cap(np.einsum("qhd,hd->qh", q16, k) * scale32, softcap)  # [n_q, n_head]
        seen = visible[:, t:t + 1]                                # [n_q, 1]
        new_max = seen & (s > m)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(np.where(new_max, m - s, s - m)).astype(np.float32)
        ms = np.where(new_max, e, np.float32(1))
        vs = np.where(seen, np.where(new_max, np.float32(1), e), np.float32(0))
        m = np.where(new_max, s, m)
        l = l * ms + vs
        acc = (acc * ms[..., None]).astype(np.float16).astype(np.float32)
        acc = (acc + v[None] * vs[..., None]).astype(np.float16).astype(np.float32)
    if sinks is not None:  # one more key after the last, value 0, on the f32 accumulator
        s = np.broadcast_to(sinks.astype(np.float32)[None, :], m.shape)
        new_max = s > m
        e = np.exp(np.where(new_max, m - s, s - m)).astype(np.float32)
        ms = np.where(new_max, e, np.float32(1))
        l = l * ms + np.where(new_max, np.float32(1), e)
        acc = acc * ms[..., None]
    return (acc * (np.float32(1) / l)[..., None]).astype(np.float32)


def attention_exact(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int,
                    scale: float | None = None, window: int = 0,
                    softcap: float = 0.0,
    ring: int | None = None, sinks: np.ndarray | None = None,
    bidirectional: tuple[int, int] | None = None) -> np.ndarray:
    """Exact softmax attention in float64: softmax(cap(q k^T * scale) + mask) v per head (the
    mask: causal, and the window when given)."""
    n_q, n_head, head_dim = q.shape
    n_kv_head = k_cache.shape[1]
    group = n_head // n_kv_head
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    positions, visible = _visible_keys(n_q, pos0, ring or k_cache.shape[0], window, bidirectional)
    rows = positions % (ring or k_cache.shape[0])
    keys = k_cache[rows].astype(np.float64)      # [n_keys, n_kv_head, head_dim]
    values = v_cache[rows].astype(np.float64)    # [n_keys, n_kv_head, head_dim]
    kv_of_head = np.arange(n_head) // group
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), keys[:, kv_of_head]) * scale  # [n_head, n_q, n_keys]
    s = np.where(visible[None], _cap(s, softcap), -np.inf)
    p = _softmax(s, sinks)
    return np.einsum("hqk,khd->qhd", p, values[:, kv_of_head]).astype(np.float32)


def attention_blocked_reference(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                                pos0: int, scale: float | None = None, window: int = 0,
                                softcap: float = 0.0,
    ring: int | None = None, sinks: np.ndarray | None = None,
    bidirectional: tuple[int, int] | None = None) -> np.ndarray:
    """Twin of attention_blocked: the f32 online softmax over blocks of TILE_KEYS keys aligned
    to key positions, per (query, head) row: m' = max(m, block max), a = e^(m - m'),
    l = l a + sum p, o = o a + p v; out = o / l (a sink taken in at the end). float32 like the
    kernel, so the two agree to float rounding in the dot products and exp."""
    n_q, n_head, head_dim = q.shape
    kv_of_head = np.arange(n_head) // (n_head // k_cache.shape[1])
    scale32 = np.float32(1.0 / math.sqrt(head_dim) if scale is None else scale)
    n_rows = ring or k_cache.shape[0]
    keys, visible = _visible_keys(n_q, pos0, n_rows, window, bidirectional)
    m = np.full((n_q, n_head), -np.inf, np.float32)
    l = np.zeros((n_q, n_head), np.float32)
    o = np.zeros((n_q, n_head, head_dim), np.float32)
    starts = np.arange(keys[0] // TILE_KEYS * TILE_KEYS, keys[-1] + 1, TILE_KEYS)
    for start in starts:
        at = (keys >= start) & (keys < start + TILE_KEYS)       # this block's keys
        rows = keys[at] % n_rows
        k = k_cache[rows][:, kv_of_head].astype(np.float32)     # [t, n_head, head_dim]
        v = v_cache[rows][:, kv_of_head].astype(np.float32)
        s = _cap(np.einsum("qhd,thd->qht", q, k) * scale32, softcap)   # [n_q, n_head, t]
        s = np.where(visible[:, None, at], s, np.float32(-np.inf))
        m_new = np.maximum(m, s.max(axis=-1))
        m_use = np.where(m_new == -np.inf, np.float32(0), m_new)
        a = np.exp(m - m_use).astype(np.float32)
        p = np.exp(s - m_use[..., None]).astype(np.float32)
        l = l * a + p.sum(axis=-1, dtype=np.float32)
        o = o * a[..., None] + np.einsum("qht,thd->qhd", p, v)
        m = m_new
    if sinks is not None:
        sink = np.broadcast_to(sinks.astype(np.float32)[None, :], m.shape)
        mf = np.maximum(m, sink)
        c = np.exp(m - mf).astype(np.float32)
        l = l * c + np.exp(sink - mf).astype(np.float32)
        o = o * c[..., None]
    return (o * (np.float32(1) / l)[..., None]).astype(np.float32)


def _softmax(s: np.ndarray, sinks: np.ndarray | None) -> np.ndarray:
    """softmax over the last axis of s [n_head, n_q, n_keys]; a head's sink is one more logit
    in the denominator (its probability goes to a value of 0)."""
    if sinks is None:
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out: np.ndarray = p / p.sum(axis=-1, keepdims=True)
        return out
    sink = np.broadcast_to(sinks.astype(np.float64)[:, None, None], s.shape[:2] + (1,))
    full = np.concatenate([s, sink], axis=-1)
    p = np.exp(full - full.max(axis=-1, keepdims=True))
    out = (p / p.sum(axis=-1, keepdims=True))[..., :-1]
    return out


def attention_rounded_reference(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                                pos0: int, scale: float | None = None, window: int = 0,
                                softcap: float = 0.0,
    ring: int | None = None, sinks: np.ndarray | None = None,
    bidirectional: tuple[int, int] | None = None) -> np.ndarray:
    """Twin of attention_rounded (llama.cpp without flash attention): attention_exact with q
    rounded to f16 before q . k and the normalised probabilities rounded to f16 before p . v."""
    n_q, n_head, head_dim = q.shape
    kv_of_head = np.arange(n_head) // (n_head // k_cache.shape[1])
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    positions, visible = _visible_keys(n_q, pos0, ring or k_cache.shape[0], window, bidirectional)
    rows = positions % (ring or k_cache.shape[0])
    keys = k_cache[rows].astype(np.float64)[:, kv_of_head]        # [n_keys, n_head, head_dim]
    values = v_cache[rows].astype(np.float64)[:, kv_of_head]
    q16 = q.astype(np.float16).astype(np.float64)
    s = np.einsum("qhd,khd->hqk", q16, keys) * scale               # [n_head, n_q, n_keys]
    s = np.where(visible[None], _cap(s, softcap), -np.inf)
    p = _softmax(s, sinks).astype(np.float16).astype(np.float64)
    return np.einsum("hqk,khd->qhd", p, values).astype(np.float32)
