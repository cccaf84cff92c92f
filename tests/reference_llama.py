"""A plain numpy llama forward pass, independent of the engine, for tests.

It reads the file with gguf.GGUFReader, dequantizes with gguf.quants.dequantize (not our code),
computes in float64 with full-precision activations, and applies rope with complex numbers.
Differences from the engine come only from the engine's 8-bit activation quantization and its
f16 KV cache, which tests bound with a tolerance.
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class ReferenceLlama:
    def __init__(self, path: str) -> None:
        r = GGUFReader(path)
        meta = {k: f.contents() for k, f in r.fields.items()
                if not k.startswith("tokenizer.ggml.")}
        a = meta["general.architecture"]
        self.n_layer = meta[f"{a}.block_count"]
        self.n_embd = meta[f"{a}.embedding_length"]
        self.n_head = meta[f"{a}.attention.head_count"]
        self.n_head_kv = meta.get(f"{a}.attention.head_count_kv", self.n_head)
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = meta.get(f"{a}.rope.dimension_count", self.head_dim)
        self.base = meta.get(f"{a}.rope.freq_base", 10000.0)
        self.eps = meta.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
        # every tensor as float64 in numpy order: [rows (ggml ne1), cols (ggml ne0)]
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        # x: [T, heads, head_dim]; adjacent pairs (2i, 2i+1) as one complex number
        half = self.n_rot // 2
        freqs = self.base ** (-np.arange(half) * 2.0 / self.n_rot)            # [half]
        rot = np.exp(1j * pos[:, None] * freqs[None, :])[:, None, :]           # [T, 1, half]
        z = x[..., :self.n_rot:2] + 1j * x[..., 1:self.n_rot:2]
        z = z * rot
        out = x.copy()
        out[..., :self.n_rot:2] = z.real
        out[..., 1:self.n_rot:2] = z.imag
        return out

    def logits(self, ids: list[int]) -> np.ndarray:
        """float64 [len(ids), n_vocab] for a fresh context."""
        w = self.w
        T = len(ids)
        pos = np.arange(T, dtype=np.float64)
        x = w["token_embd.weight"][ids]                                        # [T, n_embd]
        group = self.n_head // self.n_head_kv
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(T, self.n_head, self.head_dim)
            k = (h @ w[p + "attn_k.weight"].T).reshape(T, self.n_head_kv, self.head_dim)
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, self.n_head_kv, self.head_dim)
            q, k = self._rope(q, pos), self._rope(k, pos)
            out = np.empty_like(q)
            for hd in range(self.n_head):
                kv = hd // group
                s = q[:, hd] @ k[:, kv].T / np.sqrt(self.head_dim) + mask      # [T, T]
                s = np.exp(s - s.max(-1, keepdims=True))
                out[:, hd] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
            x = x + out.reshape(T, -1) @ w[p + "attn_output.weight"].T
            h = self._rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        x = self._rms(x, w["output_norm.weight"])
        out_w = w.get("output.weight", w["token_embd.weight"])
        return x @ out_w.T
