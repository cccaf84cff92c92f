"""bert and nomic-bert: encoders, every token seeing every other token of its text (llama.cpp's
src/models/bert.cpp, which serves both).

    x = layer_norm(token_embd[ids] + token_types[0] (+ position_embd[pos], bert)) * w + b
    for each layer (post-LN):
        q, k, v = x @ Wq (+bq), x @ Wk (+bk), x @ Wv (+bv)      nomic: one fused attn_qkv, rope
        x = layer_norm(x + attention(q, k, v) @ Wo (+bo))       attention over the whole text
        x = layer_norm(x + ffn(x))   bert: (gelu(x @ Wup + bup)) @ Wdown + bdown
                                     nomic: (silu(x @ Wgate) * (x @ Wup)) @ Wdown
    the final x is what pooling reads (no output norm)

GELU is ggml's tanh approximation, which llama.cpp's CPU backend evaluates through a table of
f16 inputs (engine.encoder.gelu_f16_table). The block is written against EncoderOps, which
engine/encoder.py's pass implements over the engine's matmul kernels; an encoder has no
decoding, so its ArchSpec `block` refuses and `encoder_block` is what runs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from ..formats import quants
from . import llama
from .base import ArchSpec, Builder, Layer
from .declare import Key, KeyValues, Tensor, fuse


class EncoderOps(Protocol):
    """What an encoder block is written in, on named rows [T, ...] of one batch of texts:
    x the hidden state, q k v attention's, o a sublayer's output, g u the FFN's."""

    def project(self, src: str,
                targets: list[tuple[quants.QuantMatrix, np.ndarray | None, str]]) -> None:
        """dst = src @ W.T (+ b where the file has the bias) for each (W, b, dst); the targets
        share their input, so an implementation may run them as one product."""

    def rope(self) -> None:
        """q and k turned at their positions in their text (NEOX pairs)."""

    def attention(self) -> None:
        """q = softmax(q k^T * scale) v within each text, every row seeing every row."""

    def residual_norm(self, weight: np.ndarray, bias: np.ndarray) -> None:
        """x = layer_norm(x + o) * weight + bias."""

    def gelu(self, buf: str) -> None:
        """buf = gelu(buf) as llama.cpp's CPU computes it."""

    def glu(self) -> None:
        """g = silu(g) * u."""


@dataclass(kw_only=True)
class BertLayer(Layer):
    wq: quants.QuantMatrix              # [n_embd rows, n_embd cols] (attn_qkv's rows when fused)
    wk: quants.QuantMatrix              # [kv_dim, n_embd]
    wv: quants.QuantMatrix              # [kv_dim, n_embd]
    wo: quants.QuantMatrix              # [n_embd, q_dim]
    attn_out_norm: np.ndarray           # float32 [n_embd] LayerNorm after attention
    attn_out_norm_b: np.ndarray         # float32 [n_embd]
    w_up: quants.QuantMatrix            # [n_ff, n_embd]
    w_down: quants.QuantMatrix          # [n_embd, n_ff]
    out_norm: np.ndarray                # float32 [n_embd] LayerNorm after the FFN
    out_norm_b: np.ndarray              # float32 [n_embd]
    bq: np.ndarray | None = None        # float32 [q_dim]
    bk: np.ndarray | None = None        # float32 [kv_dim]
    bv: np.ndarray | None = None        # float32 [kv_dim]
    bo: np.ndarray | None = None        # float32 [n_embd]
    b_up: np.ndarray | None = None      # float32 [n_ff]
    b_down: np.ndarray | None = None    # float32 [n_embd]
    w_gate: quants.QuantMatrix | None = None  # [n_ff, n_embd] nomic's SwiGLU


TENSORS = (
    Tensor("wq", "attn_q.weight", ("n_embd", "q_dim")),
    Tensor("wk", "attn_k.weight", ("n_embd", "kv_dim")),
    Tensor("wv", "attn_v.weight", ("n_embd", "kv_dim")),
    Tensor("bq", "attn_q.bias", ("q_dim",), required=False),
    Tensor("bk", "attn_k.bias", ("kv_dim",), required=False),
    Tensor("bv", "attn_v.bias", ("kv_dim",), required=False),
    Tensor("wo", "attn_output.weight", ("q_dim", "n_embd")),
    Tensor("bo", "attn_output.bias", ("n_embd",), required=False),
    Tensor("attn_out_norm", "attn_output_norm.weight", ("n_embd",)),
    Tensor("attn_out_norm_b", "attn_output_norm.bias", ("n_embd",)),
    Tensor("w_up", "ffn_up.weight", ("n_embd", "n_ff")),
    Tensor("b_up", "ffn_up.bias", ("n_ff",), required=False),
    Tensor("w_down", "ffn_down.weight", ("n_ff", "n_embd")),
    Tensor("b_down", "ffn_down.bias", ("n_embd",), required=False),
    Tensor("out_norm", "layer_output_norm.weight", ("n_embd",)),
    Tensor("out_norm_b", "layer_output_norm.bias", ("n_embd",)),
)
NOMIC_TENSORS = fuse(TENSORS, "attn_qkv.weight", "wq", "wk", "wv") + (
    Tensor("w_gate", "ffn_gate.weight", ("n_embd", "n_ff"), required=False),)

KEYS = llama.KEYS + (
    Key("rms_eps", "attention.layer_norm_epsilon", 1e-12, float),  # a LayerNorm's eps here
)


def finish(v: KeyValues) -> None:
    llama.finish(v)
    if v["n_head_kv"] != v["n_head"]:
        v.refuse(f"{v.arch} with {v['n_head_kv']} KV heads for {v['n_head']} heads is not supported")


def encoder_block(b: EncoderOps, w: BertLayer, layer: int, rope: bool) -> None:
    b.project("x", [(w.wq, w.bq, "q"), (w.wk, w.bk, "k"),  # q, k, v = x @ Wq, Wk, Wv (+ b)
                    (w.wv, w.bv, "v")])
    if rope:
        b.rope()                                              # nomic: rope q, k
    b.attention()                                             # q = attention(q, k, v)
    b.project("q", [(w.wo, w.bo, "o")])                       # o = q @ Wo (+ bo)
    b.residual_norm(w.attn_out_norm, w.attn_out_norm_b)       # x = LN(x + o)
    if w.w_gate is None:
        b.project("x", [(w.w_up, w.b_up, "g")])               # bert: g = gelu(x @ Wup + bup)
        b.gelu("g")
    else:
        b.project("x", [(w.w_gate, None, "g"),                # nomic: g = silu(x Wg) * (x Wu + bu)
                        (w.w_up, w.b_up, "u")])
        b.glu()
    b.project("g", [(w.w_down, w.b_down, "o")])               # o = g @ Wdown (+ bdown)
    b.residual_norm(w.out_norm, w.out_norm_b)                 # x = LN(x + o)


def _bert_block(b: EncoderOps, w: BertLayer, layer: int) -> None:
    encoder_block(b, w, layer, rope=False)


def _nomic_block(b: EncoderOps, w: BertLayer, layer: int) -> None:
    encoder_block(b, w, layer, rope=True)


def _no_decoding(b: Builder, w: BertLayer, layer: int) -> None:
    raise TypeError("an encoder has no decoder block: engine.encoder runs it")


BERT: ArchSpec[BertLayer] = ArchSpec("bert", KEYS, finish, BertLayer, TENSORS, _no_decoding,
                                     encoder_block=_bert_block, positions="learned")
NOMIC_BERT: ArchSpec[BertLayer] = replace(BERT, name="nomic-bert", tensors=NOMIC_TENSORS,
                                          encoder_block=_nomic_block, rope_neox=True,
                                          positions="rope")
