"""The numpy twin of attention over a quantized KV cache (type_k / type_v q8_0 or q4_0), as
llama.cpp's CPU flash attention computes it (ggml-cpu ops.cpp, its one-row path, which it takes
for every batch size once K or V is quantized: its tiled path wants f16 K and V):

    qq = q8_0(q)           the query converted to the key type's dot type, once per row
                           (q8_0 for q8_0 and q4_0 keys; f16 for f16 keys)
    for each key t in order:
        s = scale * (the block dot of ggml's AVX2 vec_dot: d_k * d_q times eight lanes of
                     integer sums, fused-added block by block, then its lane sum)
        online softmax: new max -> acc *= e^(m - s), m = s, p = 1;  else p = e^(s - m)
        acc += p * v[t]    f32 accumulator, v read back from its blocks (f16 when V is f16:
                           then the accumulator is f16-rounded after every step, as ggml's VKQ16)
    out = acc * (1 / l)

Caches are the rows engine.kv stores: [rows, n_kv_head, row_bytes] uint8 ggml blocks (or f16
[rows, n_kv_head, head_dim]). tests/engine/test_kvq_reference.py pins these numerics to
llama.cpp's logits at the model level.
"""
from __future__ import annotations

import math

import numpy as np

from engine.kernels.attention_reference import _cap, _visible_keys
from engine.kv_types import KV_TYPES, KVType, dequantize_rows, quantize_rows

Q8_0 = KV_TYPES["q8_0"]


def _blocks(rows: np.ndarray, t: KVType, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(d float32 [..., nb], quants int32 [..., nb, 32]) of q8_0 / q4_0 rows [..., row_bytes]."""
    nb = head_dim // 32
    raw = np.ascontiguousarray(rows).reshape(*rows.shape[:-1], nb, t.block_bytes)
    d = raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    if t.name == "q8_0":
        qs = raw[..., 2:].view(np.int8).astype(np.int32)
    else:
        packed = raw[..., 2:].astype(np.int32)
        qs = np.concatenate([packed & 0x0F, packed >> 4], axis=-1) - 8
    return d, qs


def _block_dot(qq: np.ndarray, dq: np.ndarray, qk: np.ndarray, dk: np.ndarray) -> np.ndarray:
    """float32 [n_q, n_head]: each query's dot with one key, as ggml's AVX2 vec_dot_q8_0_q8_0
    (and q4_0_q8_0) computes it: per block eight lanes of four consecutive integer products,
    acc = fma(d_k * d_q, lanes, acc) block by block (an fma: the float64 sum, rounded once),
    then hsum_float_8: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))."""
    ints = (qq * qk[None]).reshape(*qq.shape[:-1], 8, 4).sum(axis=-1)     # [n_q, n_head, nb, 8]
    lanes = ints.astype(np.float32)
    dd = (dk[None] * dq)[..., None]                                      # [n_q, n_head, nb, 1]
    acc = dd[..., 0, :] * lanes[..., 0, :]
    for b in range(1, lanes.shape[-2]):
        acc = (dd[..., b, :].astype(np.float64) * lanes[..., b, :]
               + acc.astype(np.float64)).astype(np.float32)
    r4 = acc[..., 4:] + acc[..., :4]
    r2 = r4[..., :2] + r4[..., 2:]
    out: np.ndarray = r2[..., 0] + r2[..., 1]
    return out


def attention_quantized_reference(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                                  type_k: KVType, type_v: KVType, pos0: int,
                                  scale: float | None = None, window: int = 0,
                                  softcap: float = 0.0, ring: int | None = None) -> np.ndarray:
    """float32 [n_q, n_head, head_dim] from q float32 [n_q, n_head, head_dim] and the cache rows."""
    n_q, n_head, head_dim = q.shape
    n_kv_head = k_cache.shape[1]
    kv_of_head = np.arange(n_head) // (n_head // n_kv_head)
    scale32 = np.float32(1.0 / math.sqrt(head_dim) if scale is None else scale)
    n_rows = ring or k_cache.shape[0]
    if type_k.quantized:
        dq, qq = _blocks(quantize_rows(q, Q8_0), Q8_0, head_dim)   # [n_q, n_head, nb(, 32)]
    else:
        q16 = q.astype(np.float16).astype(np.float32)
    acc = np.zeros((n_q, n_head, head_dim), np.float32)
    m = np.full((n_q, n_head), -np.inf, np.float32)
    l = np.zeros((n_q, n_head), np.float32)
    keys, visible = _visible_keys(n_q, pos0, n_rows, window)
    for t, p in enumerate(keys):
        row = p % n_rows
        if type_k.quantized:
            dk, qk = _blocks(k_cache[row, kv_of_head], type_k, head_dim)  # [n_head, nb(, 32)]
            s = _block_dot(qq, dq, qk, dk)
        else:
            s = np.einsum("qhd,hd->qh", q16, k_cache[row, kv_of_head].astype(np.float32))
        s = _cap(s.astype(np.float32) * scale32, softcap)
        v = dequantize_rows(v_cache[row, kv_of_head], type_v, head_dim)     # [n_head, head_dim]
        seen = visible[:, t:t + 1]
        new_max = seen & (s > m)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(np.where(new_max, m - s, s - m)).astype(np.float32)
        ms = np.where(new_max, e, np.float32(1))
        vs = np.where(seen, np.where(new_max, np.float32(1), e), np.float32(0))
        m = np.where(new_max, s, m)
        l = l * ms + vs
        acc = acc * ms[..., None]
        if not type_v.quantized:  # ggml's f16 accumulator, rounded after each step
            acc = acc.astype(np.float16).astype(np.float32)
        acc = acc + v[None] * vs[..., None]
        if not type_v.quantized:
            acc = acc.astype(np.float16).astype(np.float32)
    return (acc * (np.float32(1) / l)[..., None]).astype(np.float32)
