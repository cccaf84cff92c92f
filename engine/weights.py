"""A model's tensors from its GGUF mapping, named and shaped as its family's spec says.

Every tensor the file holds must be used: one the engine does not know (a bias llama.cpp would
add, an extra norm) is refused at load rather than silently left out of the computation.
Fused tensors (phi3's attn_qkv and [gate; up] ffn_up) are served as row ranges of the one
matrix, views into the mapping, so the block and the kernels see ordinary matrices.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arch import LayerWeights
from .formats import quants
from .gguf import GGUFFile, ModelLoadError, TensorInfo
from .hparams import HParams


@dataclass
class Weights:
    token_embd: quants.QuantMatrix  # [n_vocab, n_embd]
    layers: list[LayerWeights]
    output_norm: np.ndarray         # float32 [n_embd]
    output: quants.QuantMatrix      # [n_vocab, n_embd]; token_embd itself when tied
    #                                 (the matrices may be RepackedMatrix once a Transformer prepares them)
    rope_freqs: np.ndarray | None   # float32 [n_rot / 2] per-frequency divisors (llama 3.1,
    #                                 phi3's LongRoPE factors)

    def matrices(self) -> list[quants.QuantMatrix]:
        out = [self.token_embd, self.output]
        for layer in self.layers:
            out += layer.matrices()
        return out


def row_range(m: quants.QuantMatrix, start: int, n: int) -> quants.QuantMatrix:
    """Rows [start, start + n) of m as a matrix of its own (a view, no copy)."""
    return quants.QuantMatrix(m.raw[start:start + n], m.qtype, n, m.n_cols)


def load_weights(f: GGUFFile, hp: HParams, n_ctx: int) -> Weights:
    path, spec = str(f.path), hp.spec
    used: set[str] = set()

    def info(name: str, shape: tuple[int, ...]) -> TensorInfo:
        t = f.tensors.get(name)
        if t is None:
            raise ModelLoadError(path, f"tensor {name} is missing")
        if t.shape != shape:
            raise ModelLoadError(path, f"tensor {name} has shape {list(t.shape)}, the "
                                       f"hyperparameters say {list(shape)}")
        if t.qtype not in quants.SUPPORTED:
            raise ModelLoadError(path, f"tensor {name}: type {t.qtype.name} is not supported "
                                       f"(supported: {', '.join(sorted(q.name for q in quants.SUPPORTED))})")
        used.add(name)
        return t

    def matrix(name: str, n_cols: int, n_rows: int) -> quants.QuantMatrix:
        t = info(name, (n_cols, n_rows))
        raw = f.tensor_data(name).reshape(n_rows, -1)  # uint8 [n_rows, row_bytes]
        return quants.QuantMatrix(raw, t.qtype, n_rows, n_cols)

    def vector(name: str, n: int) -> np.ndarray:
        t = info(name, (n,))
        raw = f.tensor_data(name).reshape(1, -1)
        return np.ascontiguousarray(quants.dequantize(raw, t.qtype, n)[0], dtype=np.float32)

    def optional(name: str, n: int) -> np.ndarray | None:
        return vector(name, n) if name in f.tensors else None

    E, F, Q, KV, HD = hp.n_embd, hp.n_ff, hp.q_dim, hp.kv_dim, hp.head_dim
    layers = []
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        if spec.fused_qkv:
            qkv = matrix(p + "attn_qkv.weight", E, Q + 2 * KV)
            wq, wk, wv = row_range(qkv, 0, Q), row_range(qkv, Q, KV), row_range(qkv, Q + KV, KV)
        else:
            wq = matrix(p + "attn_q.weight", E, Q)
            wk = matrix(p + "attn_k.weight", E, KV)
            wv = matrix(p + "attn_v.weight", E, KV)
        if spec.fused_gate_up:
            gate_up = matrix(p + "ffn_up.weight", E, 2 * F)
            w_gate, w_up = row_range(gate_up, 0, F), row_range(gate_up, F, F)
        else:
            w_gate, w_up = matrix(p + "ffn_gate.weight", E, F), matrix(p + "ffn_up.weight", E, F)
        layer = LayerWeights(
            attn_norm=vector(p + "attn_norm.weight", E), wq=wq, wk=wk, wv=wv,
            wo=matrix(p + "attn_output.weight", Q, E), ffn_norm=vector(p + "ffn_norm.weight", E),
            w_gate=w_gate, w_up=w_up, w_down=matrix(p + "ffn_down.weight", F, E))
        if spec.qkv_bias:
            layer.bq = vector(p + "attn_q.bias", Q)
            layer.bk = vector(p + "attn_k.bias", KV)
            layer.bv = vector(p + "attn_v.bias", KV)
        if spec.qk_norm:
            layer.q_norm = vector(p + "attn_q_norm.weight", HD)
            layer.k_norm = vector(p + "attn_k_norm.weight", HD)
        if spec.post_norms:
            layer.post_attn_norm = vector(p + "post_attention_norm.weight", E)
            layer.post_ffn_norm = vector(p + "post_ffw_norm.weight", E)
        layers.append(layer)
    token_embd = matrix("token_embd.weight", E, hp.n_vocab)
    output = matrix("output.weight", E, hp.n_vocab) if "output.weight" in f.tensors else token_embd
    half = hp.n_rot // 2
    rope_freqs = optional("rope_freqs.weight", half)
    long, short = optional("rope_factors_long.weight", half), optional("rope_factors_short.weight", half)
    if long is not None or short is not None:  # LongRoPE: llama.cpp's switch on the context
        rope_freqs = long if hp.n_ctx_orig and n_ctx > hp.n_ctx_orig else short
        if rope_freqs is None:
            raise ModelLoadError(path, "LongRoPE needs both rope_factors_long and _short")
    weights = Weights(token_embd, layers, vector("output_norm.weight", E), output, rope_freqs)
    unused = sorted(set(f.tensors) - used)
    if unused:
        raise ModelLoadError(path, f"tensor {unused[0]} is not part of the engine's {hp.arch} "
                                   f"block ({len(unused)} unused tensors): not supported")
    return weights
