"""Gemma 4 in plain float64 numpy, independent of the engine (tests/support/reference_model.py's
way: gguf.GGUFReader, gguf.quants.dequantize, exact math, rope with complex numbers), written
from llama.cpp's src/models/gemma4.cpp and src/llama-model.cpp, not from engine.arch:

    x = embed * sqrt(n_embd)
    ple[l] = (rms(x @ per_layer_model_proj.T / sqrt(n_embd) split by layer) * per_layer_proj_norm
              + per_layer_token_embd[ids] * sqrt(n_pl)) / sqrt(2)
    layer l (sliding per sliding_window_pattern: key_length_swa, rope.dimension_count_swa,
    freq_base_swa; full: key_length, rope_freqs factors):
        q = rms_heads(h @ Wq) * q_norm, rope;  k = rms_heads(h @ Wk) * k_norm, rope;
        v = rms_heads(h @ Wv) (no weight); layers >= n_layer - shared_kv_layers reuse layer
        n_kv - 2 (sliding) or n_kv - 1 (full)'s k, v; attention scale 1, window W on sliding
        x += rms(attn @ Wo) * post_attention_norm
        x += rms(gelu_tanh-GLU FFN(rms(x) * ffn_norm)) * post_ffw_norm
        x += rms((gelu_tanh(x @ inp_gate.T) * ple[l]) @ proj.T) * post_norm
        x *= layer_output_scale
    logits = softcap(rms(x) * output_norm @ token_embd.T)
"""
from __future__ import annotations

import math

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def _gelu(g: np.ndarray) -> np.ndarray:
    return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))


class Gemma4Reference:
    def __init__(self, path: str) -> None:
        r = GGUFReader(path)
        meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}

        def get(key, default=None):
            return meta.get(f"gemma4.{key}", default)

        self.n_layer, self.n_embd = get("block_count"), get("embedding_length")
        self.n_head = get("attention.head_count")  # KV heads and FFN widths: from the tensors
        self.head_dim = get("attention.key_length")
        self.head_dim_swa = get("attention.key_length_swa", self.head_dim)
        self.n_rot = get("rope.dimension_count", self.head_dim)
        self.n_rot_swa = get("rope.dimension_count_swa", self.n_rot)
        self.base = get("rope.freq_base", 10000.0)
        self.base_swa = get("rope.freq_base_swa", self.base)
        self.eps = get("attention.layer_norm_rms_epsilon")
        self.window = get("attention.sliding_window")
        self.swa = [bool(x) for x in get("attention.sliding_window_pattern")]
        self.n_kv = self.n_layer - get("attention.shared_kv_layers", 0)
        self.n_pl = get("embedding_length_per_layer_input", 0)
        self.final_softcap = get("final_logit_softcapping", 0.0)
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}

    def _rms(self, x: np.ndarray, w: np.ndarray | float = 1.0) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray, layer: int) -> np.ndarray:
        """NEOX pairs (i, i + n_rot/2); the full layers' angles divided by rope_freqs."""
        swa = self.swa[layer]
        n_rot, base = (self.n_rot_swa, self.base_swa) if swa else (self.n_rot, self.base)
        half = n_rot // 2
        freqs = base ** (-np.arange(half) * 2.0 / n_rot)
        if not swa and "rope_freqs.weight" in self.w:
            freqs = freqs / self.w["rope_freqs.weight"]
        z = (x[..., :half] + 1j * x[..., half:n_rot]) * np.exp(1j * pos[:, None, None] * freqs)
        out = x.copy()
        out[..., :half], out[..., half:n_rot] = z.real, z.imag
        return out

    def kv_source(self, layer: int) -> int:
        if layer < self.n_kv:
            return layer
        return self.n_kv - (2 if self.swa[layer] else 1)

    def logits(self, ids: list[int], *, shared_kv: bool = True) -> np.ndarray:
        """float64 [len(ids), n_vocab] for a fresh context."""
        w, T = self.w, len(ids)
        self.trace: list[np.ndarray] = []  # x after each layer
        pos = np.arange(T, dtype=np.float64)
        x = w["token_embd.weight"][ids] * math.sqrt(self.n_embd)
        ple = None
        if self.n_pl:
            proj = (x @ w["per_layer_model_proj.weight"].T / math.sqrt(self.n_embd))
            proj = self._rms(proj.reshape(T, self.n_layer, self.n_pl), w["per_layer_proj_norm.weight"])
            tok = w["per_layer_token_embd.weight"][ids].reshape(T, self.n_layer, self.n_pl)
            ple = (proj + tok * math.sqrt(self.n_pl)) / math.sqrt(2)            # [T, L, n_pl]
        dist = np.arange(T)[:, None] - np.arange(T)[None, :]
        kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for i in range(self.n_layer):
            p = f"blk.{i}."
            hd = self.head_dim_swa if self.swa[i] else self.head_dim
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = self._rms((h @ w[p + "attn_q.weight"].T).reshape(T, self.n_head, hd),
                          w[p + "attn_q_norm.weight"])
            q = self._rope(q, pos, i)
            src = self.kv_source(i) if shared_kv else i
            if src == i:
                k = (h @ w[p + "attn_k.weight"].T).reshape(T, -1, hd)  # KV heads: the layer's
                wv = w.get(p + "attn_v.weight", w[p + "attn_k.weight"])
                v = self._rms((h @ wv.T).reshape(T, -1, hd))
                k = self._rope(self._rms(k, w[p + "attn_k_norm.weight"]), pos, i)
                kv[i] = (k, v)
            k, v = kv[src]
            group = self.n_head // k.shape[1]
            visible = (dist >= 0) & (dist < self.window) if self.swa[i] else dist >= 0
            mask = np.where(visible, 0.0, -np.inf)
            out = np.empty_like(q)
            for head in range(self.n_head):
                s = q[:, head] @ k[:, head // group].T + mask                   # scale 1
                s = np.exp(s - s.max(-1, keepdims=True))
                out[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, head // group]
            attn = out.reshape(T, -1) @ w[p + "attn_output.weight"].T
            x = x + self._rms(attn, w[p + "post_attention_norm.weight"])
            h = self._rms(x, w[p + "ffn_norm.weight"])
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + self._rms((_gelu(g) * u) @ w[p + "ffn_down.weight"].T, w[p + "post_ffw_norm.weight"])
            if ple is not None:
                gated = _gelu(x @ w[p + "inp_gate.weight"].T) * ple[:, i]
                x = x + self._rms(gated @ w[p + "proj.weight"].T, w[p + "post_norm.weight"])
            if p + "layer_output_scale.weight" in w:
                x = x * w[p + "layer_output_scale.weight"][0]
            self.trace.append(x)
        x = self._rms(x, w["output_norm.weight"])
        logits = x @ w.get("output.weight", w["token_embd.weight"]).T
        if self.final_softcap:
            logits = self.final_softcap * np.tanh(logits / self.final_softcap)
        return logits
