"""llama (and Mistral, which loads as llama): the pre-norm block the other families vary.

    x += attention(rms_norm(x) * attn_norm) @ Wo
    x += (silu(h @ Wgate) * (h @ Wup)) @ Wdown,   h = rms_norm(x) * ffn_norm

Its declaration is every family's default: KEYS (the hyperparameters, llama.cpp's defaults),
TENSORS (one layer's), and the block's optional parts a llama-like family switches on by
declaring their tensors: QKV_BIAS (qwen2) and QK_NORM (qwen3, gemma3).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formats import quants
from ..rope_settings import RopeTrain, context_rope
from .base import ArchSpec, Builder, Layer
from .declare import Key, KeyValues, Tensor


def _head_dim(v: Mapping[str, Any]) -> int:
    n_head: int = v["n_head"]
    return v["n_embd"] // n_head if n_head > 0 else 0  # n_head <= 0 is refused by finish


KEYS = (
    Key("n_ctx_train", "context_length", 2048),
    Key("n_embd", "embedding_length"),
    Key("n_layer", "block_count"),
    Key("n_ff", "feed_forward_length"),
    Key("n_head", "attention.head_count"),
    Key("n_head_kv", "attention.head_count_kv", lambda v: v["n_head"]),
    Key("head_dim", "attention.key_length", _head_dim),
    Key("value_dim", "attention.value_length", lambda v: v["head_dim"]),
    Key("n_rot", "rope.dimension_count", lambda v: v["head_dim"]),
    Key("rope_base", "rope.freq_base", 10000.0, float),
    Key("rope_scaling", "rope.scaling.type", "linear", str),  # llama.cpp's default, as the factor
    Key("rope_scaling_factor", "rope.scaling.factor", 1.0, float),
    Key("rope_attn_factor", "rope.scaling.attn_factor", 1.0, float),
    Key("n_ctx_orig", "rope.scaling.original_context_length", 0),
    Key("yarn_ext_factor", "rope.scaling.yarn_ext_factor", -1.0, float),  # < 0: from the type
    Key("yarn_attn_factor", "rope.scaling.yarn_attn_factor", 1.0, float),
    Key("yarn_beta_fast", "rope.scaling.yarn_beta_fast", 32.0, float),
    Key("yarn_beta_slow", "rope.scaling.yarn_beta_slow", 1.0, float),
    Key("rms_eps", "attention.layer_norm_rms_epsilon", 1e-5, float),
)


def finish(v: KeyValues) -> None:
    """Refuse what llama's block cannot honour; the rope keys become the file's RopeTrain and,
    through engine.rope_settings with nothing overridden, rope_freq_scale and the YaRN
    parameters (llama-model.cpp's hparams, then llama-context.cpp's cparams)."""
    n_head, n_head_kv = v["n_head"], v["n_head_kv"]
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        v.refuse(f"{n_head} attention heads cannot share {n_head_kv} KV heads")
    if v.pop("value_dim") != v["head_dim"]:
        v.refuse(f"{v.arch}.attention.value_length differs from key_length (not supported)")
    scaling, factor = v.pop("rope_scaling"), v.pop("rope_scaling_factor") or 1.0
    if scaling not in ("none", "linear", "yarn") and factor != 1.0:
        v.refuse(f"rope scaling {scaling!r} is not supported")
    train = RopeTrain(
        freq_base=v["rope_base"], scaling=scaling, freq_scale=float(np.float32(1) / np.float32(factor)),
        attn_factor=v.pop("rope_attn_factor") or 1.0, yarn_ext_factor=v.pop("yarn_ext_factor"),
        yarn_attn_factor=v["yarn_attn_factor"], yarn_beta_fast=v["yarn_beta_fast"],
        yarn_beta_slow=v["yarn_beta_slow"], n_ctx_orig=v["n_ctx_orig"] or v["n_ctx_train"])
    v["rope_train"] = train
    v.update(vars(context_rope(train)))  # the file as it is: no setting overrides it


@dataclass(kw_only=True)
class AttentionLayer(Layer):
    """The attention sublayer's tensors and the FFN's norm, whatever the FFN (a mixture of
    experts keeps these); the optional ones are there when the family declares them."""
    attn_norm: np.ndarray               # float32 [n_embd]
    wq: quants.QuantMatrix              # [q_dim rows, n_embd cols] (a row range of attn_qkv when fused)
    wk: quants.QuantMatrix              # [kv_dim, n_embd]
    wv: quants.QuantMatrix              # [kv_dim, n_embd]
    wo: quants.QuantMatrix              # [n_embd, q_dim]
    ffn_norm: np.ndarray                # float32 [n_embd]
    bq: np.ndarray | None = None        # float32 [q_dim]   QKV_BIAS
    bk: np.ndarray | None = None        # float32 [kv_dim]
    bv: np.ndarray | None = None        # float32 [kv_dim]
    q_norm: np.ndarray | None = None    # float32 [head_dim]  QK_NORM: per-head, before rope
    k_norm: np.ndarray | None = None    # float32 [head_dim]


@dataclass(kw_only=True)
class LlamaLayer(AttentionLayer):
    """One block's tensors: attention's and the dense FFN's."""
    w_gate: quants.QuantMatrix          # [n_ff, n_embd] (the first half of ffn_up when fused)
    w_up: quants.QuantMatrix            # [n_ff, n_embd]
    w_down: quants.QuantMatrix          # [n_embd, n_ff]


ATTENTION_TENSORS = (
    Tensor("attn_norm", "attn_norm.weight", ("n_embd",)),
    Tensor("wq", "attn_q.weight", ("n_embd", "q_dim")),
    Tensor("wk", "attn_k.weight", ("n_embd", "kv_dim")),
    Tensor("wv", "attn_v.weight", ("n_embd", "kv_dim")),
    Tensor("wo", "attn_output.weight", ("q_dim", "n_embd")),
    Tensor("ffn_norm", "ffn_norm.weight", ("n_embd",)),
)
TENSORS = ATTENTION_TENSORS + (
    Tensor("w_gate", "ffn_gate.weight", ("n_embd", "n_ff")),
    Tensor("w_up", "ffn_up.weight", ("n_embd", "n_ff")),
    Tensor("w_down", "ffn_down.weight", ("n_ff", "n_embd")),
)
QKV_BIAS = (
    Tensor("bq", "attn_q.bias", ("q_dim",)),
    Tensor("bk", "attn_k.bias", ("kv_dim",)),
    Tensor("bv", "attn_v.bias", ("kv_dim",)),
)
QK_NORM = (
    Tensor("q_norm", "attn_q_norm.weight", ("head_dim",)),
    Tensor("k_norm", "attn_k_norm.weight", ("head_dim",)),
)


def attention(b: Builder, w: AttentionLayer, layer: int, scale_q_first: bool = False) -> None:
    """o = attention(h) @ Wo, with the optional biases and per-head q/k norms of the family."""
    b.project("h", [(w.wq, "q"), (w.wk, "k"), (w.wv, "v")])  # q, k, v = h @ Wq, Wk, Wv
    if w.bq is not None and w.bk is not None and w.bv is not None:
        b.add_bias("q", w.bq)                                 # qwen2: + bq, bk, bv
        b.add_bias("k", w.bk)
        b.add_bias("v", w.bv)
    if w.q_norm is not None and w.k_norm is not None:
        b.head_norm("q", w.q_norm)                            # qwen3, gemma3: per-head norms
        b.head_norm("k", w.k_norm)
    b.rope_store(layer)                                       # rope q, k; k, v -> cache
    if scale_q_first:
        b.scale_q()                                           # gemma: q *= 1/sqrt(head_dim)
    b.attention(layer)                                        # q = attention(q, cache)
    b.project("q", [(w.wo, "o")])                             # o = q @ Wo


def ffn(b: Builder, w: LlamaLayer, act: str) -> None:
    """o = (act(h @ Wgate) * (h @ Wup)) @ Wdown."""
    b.project("h", [(w.w_gate, "g"), (w.w_up, "u")])
    b.glu(act)                                                # g = act(g) * u
    b.project("g", [(w.w_down, "o")])


def block(b: Builder, w: LlamaLayer, layer: int) -> None:
    b.add_norm(w.attn_norm)                                   # x += o; h = rms_norm(x) * attn_norm
    attention(b, w, layer)
    b.add_norm(w.ffn_norm)                                    # x += o; h = rms_norm(x) * ffn_norm
    ffn(b, w, "silu")


SPEC = ArchSpec("llama", KEYS, finish, LlamaLayer, TENSORS, block)
