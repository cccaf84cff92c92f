"""What an architecture is to the engine: a spec (features, as data) and a block written once.

A family module (llama.py, qwen.py, phi3.py, gemma.py) declares an ArchSpec: which tensors its
layers have and which block features it uses, and its block, a few lines against `Builder`.
Both ways of running the model implement Builder: the fused task graph (model._GraphBuilder,
one node per call) and the readable eager twin (model._EagerBuilder, numpy arrays op by op). So
a family's layer exists once, and the two paths cannot drift apart.

Builder works on the forward pass's named activation rows, all [T, ...] float32:
    x  residual stream [n_embd]        h  normed x [n_embd]        o  a sublayer's output [n_embd]
    q  queries, then the attention output [q_dim]    k, v  keys and values [kv_dim]
    g  FFN gate, then act(gate) * up [n_ff]          u  FFN up [n_ff]
The residual add rides on the next norm: add_norm(w) is x += o (when o holds a sublayer's
output), h = rms_norm(x) * w, so a block reads like pre-norm transformer algebra.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..formats import quants


@dataclass
class LayerWeights:
    """One block's tensors; a feature the family does not use stays None."""
    attn_norm: np.ndarray               # float32 [n_embd]
    wq: quants.QuantMatrix              # [q_dim rows, n_embd cols] (a row range of attn_qkv when fused)
    wk: quants.QuantMatrix              # [kv_dim, n_embd]
    wv: quants.QuantMatrix              # [kv_dim, n_embd]
    wo: quants.QuantMatrix              # [n_embd, q_dim]
    ffn_norm: np.ndarray                # float32 [n_embd]
    w_gate: quants.QuantMatrix          # [n_ff, n_embd] (the first half of ffn_up when fused)
    w_up: quants.QuantMatrix            # [n_ff, n_embd]
    w_down: quants.QuantMatrix          # [n_embd, n_ff]
    bq: np.ndarray | None = None        # float32 [q_dim]   qwen2's projection biases
    bk: np.ndarray | None = None        # float32 [kv_dim]
    bv: np.ndarray | None = None        # float32 [kv_dim]
    q_norm: np.ndarray | None = None    # float32 [head_dim]  per-head norms before rope
    k_norm: np.ndarray | None = None    # float32 [head_dim]
    post_attn_norm: np.ndarray | None = None  # float32 [n_embd]  gemma's sandwich norms
    post_ffn_norm: np.ndarray | None = None   # float32 [n_embd]

    def matrices(self) -> list[quants.QuantMatrix]:
        return [self.wq, self.wk, self.wv, self.wo, self.w_gate, self.w_up, self.w_down]


class Builder(Protocol):
    """The operations a block is written in (see the module docstring for the buffers)."""

    def add_norm(self, weight: np.ndarray) -> None:
        """x += o (if a sublayer wrote o); h = rms_norm(x) * weight."""

    def norm(self, buf: str, weight: np.ndarray) -> None:
        """buf = rms_norm(buf) * weight, in place (gemma's post-norms of o)."""

    def project(self, src: str, targets: list[tuple[quants.QuantMatrix, str]]) -> None:
        """dst = src @ W.T for each (W, dst)."""

    def add_bias(self, buf: str, bias: np.ndarray) -> None:
        """buf += bias, per row."""

    def head_norm(self, buf: str, weight: np.ndarray) -> None:
        """Each head_dim vector of buf (q or k) = rms_norm(it) * weight."""

    def rope_store(self, layer: int) -> None:
        """rope q and k at their positions (this layer's base); k, v -> this layer's cache."""

    def scale_q(self) -> None:
        """q *= the attention scale, and the next attention scales by 1 (gemma's order: llama.cpp
        scales q before q . k, so q's f16 rounding sees the scaled values)."""

    def attention(self, layer: int) -> None:
        """q = attention(q, this layer's cache): causal, its window, softcap and scale."""

    def glu(self, act: str) -> None:
        """g = act(g) * u, act "silu" or "gelu_tanh"."""


Block = Callable[[Builder, LayerWeights, int], None]


@dataclass(frozen=True)
class ArchSpec:
    """One family's differences from llama, as data (the facts are llama.cpp's)."""
    name: str                       # general.architecture
    block: Block                    # its layer, written against Builder
    rope_neox: bool = False         # rope pairs (i, i + n_rot/2) rather than (2i, 2i+1)
    qkv_bias: bool = False          # attn_q/k/v.bias after the projections
    qk_norm: bool = False           # attn_q_norm / attn_k_norm per head, before rope
    fused_qkv: bool = False         # one attn_qkv with rows [q; k; v]
    fused_gate_up: bool = False     # ffn_up with rows [gate; up], no ffn_gate
    post_norms: bool = False        # post_attention_norm and post_ffw_norm on each sublayer
    embed_scale: bool = False       # the embedding row times sqrt(n_embd)
    ffn_act: str = "silu"           # "silu" or "gelu_tanh"
    swa_period: int = 0             # with a sliding window W: layer i is local when
    #                                 i % swa_period < swa_period - 1 (0: no local layers)
    swa_rope_base: float | None = None  # local layers' rope base unless the file sets one
    attn_softcap: bool = False      # reads attn_logit_softcapping (scores c * tanh(s / c))
    final_softcap: bool = False     # reads final_logit_softcapping (the logits likewise)
    embd_scale_layers: tuple[int, ...] = ()  # layer counts (27B) whose attention scale is
    #                                           1/sqrt(n_embd/n_head) rather than 1/sqrt(head_dim)
