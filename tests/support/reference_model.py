"""A plain numpy forward pass for every family the engine serves, independent of the engine.

It reads the file with gguf.GGUFReader, dequantizes with gguf.quants.dequantize (not our code),
computes in float64 with exact math (no f16 KV cache, no 8-bit activations, exact gelu and
tanh), applies rope with complex numbers, and takes each family's rules from llama.cpp as
tests/data/synth/README.md writes them down, not from engine.arch:

    llama    pre-norm block, silu FFN, rope on adjacent pairs
    qwen2    + q/k/v biases; NEOX rope (pairs i, i + n_rot/2)
    qwen3    + per-head RMS norm of q and k before rope; NEOX
    phi3     fused attn_qkv [q; k; v] and ffn_up [gate; up]; NEOX
    gemma2/3 x * sqrt(n_embd); sandwich norms; gelu_tanh FFN; NEOX; sliding window W on local
             layers (gemma2: even layers; gemma3: i % 6 < 5, rope base freq_base_swa or 1e4);
             gemma3 q/k norms; gemma2 attention softcap (after the scale) and final softcap
"""
from __future__ import annotations

import math

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

NEOX = {"qwen2", "qwen3", "phi3", "gemma2", "gemma3"}


class ReferenceModel:
    def __init__(self, path: str) -> None:
        r = GGUFReader(path)
        meta = {k: f.contents() for k, f in r.fields.items()
                if not k.startswith("tokenizer.ggml.")}
        a = self.arch = meta["general.architecture"]

        def get(key, default=None):
            return meta.get(f"{a}.{key}", default)

        self.n_layer = get("block_count")
        self.n_embd = get("embedding_length")
        self.n_head = get("attention.head_count")
        self.n_head_kv = get("attention.head_count_kv", self.n_head)
        self.head_dim = get("attention.key_length", self.n_embd // self.n_head)
        self.n_rot = get("rope.dimension_count", self.head_dim)
        self.base = get("rope.freq_base", 10000.0)
        self.eps = get("attention.layer_norm_rms_epsilon", 1e-5)
        self.gemma = a in ("gemma2", "gemma3")
        self.window = get("attention.sliding_window", 0) if self.gemma else 0
        self.base_swa = get("rope.freq_base_swa", 10000.0 if a == "gemma3" else self.base)
        self.attn_softcap = get("attn_logit_softcapping", 0.0) if a == "gemma2" else 0.0
        self.final_softcap = get("final_logit_softcapping", 0.0) if self.gemma else 0.0
        # every tensor as float64 in numpy order: [rows (ggml ne1), cols (ggml ne0)]
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}

    def local(self, layer: int) -> bool:
        period = {"gemma2": 2, "gemma3": 6}.get(self.arch, 0)
        return bool(self.window) and layer % period < period - 1

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
        # x: [T, heads, head_dim]; each rotated pair as one complex number
        half = self.n_rot // 2
        freqs = base ** (-np.arange(half) * 2.0 / self.n_rot)                  # [half]
        rot = np.exp(1j * pos[:, None] * freqs[None, :])[:, None, :]           # [T, 1, half]
        if self.arch in NEOX:
            first, second = np.s_[..., :half], np.s_[..., half:self.n_rot]
        else:
            first, second = np.s_[..., :self.n_rot:2], np.s_[..., 1:self.n_rot:2]
        z = (x[first] + 1j * x[second]) * rot
        out = x.copy()
        out[first], out[second] = z.real, z.imag
        return out

    def _projections(self, p: str, h: np.ndarray) -> tuple[np.ndarray, ...]:
        w, T, hd = self.w, h.shape[0], self.head_dim
        q_dim, kv_dim = self.n_head * hd, self.n_head_kv * hd
        if p + "attn_qkv.weight" in w:
            qkv = h @ w[p + "attn_qkv.weight"].T
            q, k, v = qkv[:, :q_dim], qkv[:, q_dim:q_dim + kv_dim], qkv[:, q_dim + kv_dim:]
        else:
            q, k, v = (h @ w[p + f"attn_{n}.weight"].T for n in "qkv")
            if p + "attn_q.bias" in w:
                q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        q = q.reshape(T, self.n_head, hd)
        k = k.reshape(T, self.n_head_kv, hd)
        v = v.reshape(T, self.n_head_kv, hd)
        if p + "attn_q_norm.weight" in w:
            q, k = self._rms(q, w[p + "attn_q_norm.weight"]), self._rms(k, w[p + "attn_k_norm.weight"])
        return q, k, v

    def _ffn(self, p: str, h: np.ndarray) -> np.ndarray:
        w = self.w
        if p + "ffn_gate.weight" in w:
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        else:  # phi3: ffn_up holds [gate; up]
            gu = h @ w[p + "ffn_up.weight"].T
            g, u = np.split(gu, 2, axis=-1)
        if self.gemma:
            act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        else:
            act = g / (1 + np.exp(-g))
        return (act * u) @ w[p + "ffn_down.weight"].T

    def logits(self, ids: list[int], kv_store=None, q_store=None) -> np.ndarray:
        """float64 [len(ids), n_vocab] for a fresh context. kv_store: what a cache does to the
        keys and values it stores and reads back (float64 [T, n_head_kv, head_dim] -> the same;
        a quantized KV cache's round trip), else exact; q_store: the same for the queries
        (llama.cpp's flash attention converts q to the key type's dot-product type)."""
        w = self.w
        T = len(ids)
        pos = np.arange(T, dtype=np.float64)
        x = w["token_embd.weight"][ids]                                        # [T, n_embd]
        if self.gemma:
            x = x * math.sqrt(self.n_embd)
        group = self.n_head // self.n_head_kv
        dist = np.arange(T)[:, None] - np.arange(T)[None, :]                   # query - key
        for i in range(self.n_layer):
            p = f"blk.{i}."
            local = self.local(i)
            visible = (dist >= 0) & (dist < self.window) if local else dist >= 0
            mask = np.where(visible, 0.0, -np.inf)
            h = self._rms(x, w[p + "attn_norm.weight"])
            q, k, v = self._projections(p, h)
            base = self.base_swa if local else self.base
            q, k = self._rope(q, pos, base), self._rope(k, pos, base)
            if kv_store is not None:
                k, v = kv_store(k), kv_store(v)
            if q_store is not None:
                q = q_store(q)
            out = np.empty_like(q)
            for hd in range(self.n_head):
                kv = hd // group
                s = q[:, hd] @ k[:, kv].T / np.sqrt(self.head_dim)              # [T, T]
                if self.attn_softcap:
                    s = self.attn_softcap * np.tanh(s / self.attn_softcap)
                s = np.exp(s + mask - (s + mask).max(-1, keepdims=True))
                out[:, hd] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
            attn = out.reshape(T, -1) @ w[p + "attn_output.weight"].T
            if self.gemma:
                attn = self._rms(attn, w[p + "post_attention_norm.weight"])
            x = x + attn
            ffn = self._ffn(p, self._rms(x, w[p + "ffn_norm.weight"]))
            if self.gemma:
                ffn = self._rms(ffn, w[p + "post_ffw_norm.weight"])
            x = x + ffn
        x = self._rms(x, w["output_norm.weight"])
        logits = x @ w.get("output.weight", w["token_embd.weight"]).T
        if self.final_softcap:
            logits = self.final_softcap * np.tanh(logits / self.final_softcap)
        return logits
