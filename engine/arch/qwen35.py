"""qwen35 (Qwen3.5): Gated DeltaNet linear-attention layers interleaved with gated full attention.

Layer i is recurrent as attention.recurrent_layers says, or without it unless
(i + 1) % full_attention_interval == 0 (interval 4: three DeltaNet layers to one attention
layer). Every block:

    h = rms_norm(x) * attn_norm
    x += mixer(h)                      DeltaNet (engine/delta_net_layer.py), or gated attention:
        [q; gate] per head = h @ Wq;  k, v = h @ Wk, Wv;  q, k rms-normed per head
        rope q, k (IMROPE: for text positions, NEOX over the first n_rot dims)
        o = (attention(q, K, V) * sigmoid(gate)) @ Wo
    h = rms_norm(x) * post_attention_norm
    x += (silu(h @ Wgate) * (h @ Wup)) @ Wdown

llama.cpp's src/models/qwen35.cpp and delta-net-base.cpp. The rope sections
(rope.dimension_sections) pick which of a position's (t, h, w) parts turns each pair; a text
token's parts are all its position, so the sections change nothing for text and are not read.
The DeltaNet layers keep a state per sequence instead of KV rows (engine/recurrent.py), which
KVCache holds beside the attention layers' cache. A file whose last nextn_predict_layers blocks
are a multi-token-prediction draft head loads its trunk only (the draft is not run).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..delta_net_layer import DeltaNetDims, DeltaNetWeights
from ..formats import quants
from ..recurrent import RecurrentShape
from . import llama
from .base import ArchSpec, Builder, Layer
from .declare import Key, KeyValues, Tensor

if TYPE_CHECKING:
    from ..hparams import HParams


@dataclass(kw_only=True)
class Qwen35Layer(Layer):
    attn_norm: np.ndarray                       # float32 [n_embd]
    ffn_norm: np.ndarray                        # float32 [n_embd] (post_attention_norm)
    w_gate: quants.QuantMatrix                  # [n_ff, n_embd]
    w_up: quants.QuantMatrix
    w_down: quants.QuantMatrix                  # [n_embd, n_ff]
    # gated attention layers
    wq: quants.QuantMatrix | None = None        # [2 * q_dim, n_embd]: per head [q; gate]
    wk: quants.QuantMatrix | None = None
    wv: quants.QuantMatrix | None = None
    wo: quants.QuantMatrix | None = None
    q_norm: np.ndarray | None = None            # float32 [head_dim]
    k_norm: np.ndarray | None = None
    # DeltaNet layers
    wqkv: quants.QuantMatrix | None = None      # [conv_dim, n_embd]
    wz: quants.QuantMatrix | None = None        # [ssm_v_dim, n_embd] (attn_gate)
    w_beta: quants.QuantMatrix | None = None    # [dt_rank, n_embd]
    w_alpha: quants.QuantMatrix | None = None   # [dt_rank, n_embd]
    conv: np.ndarray | None = None              # float32 [conv_dim, d_conv]
    dt_bias: np.ndarray | None = None           # float32 [dt_rank]
    ssm_a: np.ndarray | None = None             # float32 [dt_rank]
    ssm_norm: np.ndarray | None = None          # float32 [d_state]
    ssm_out: quants.QuantMatrix | None = None   # [n_embd, ssm_v_dim]


KEYS = llama.KEYS + (
    Key("d_conv", "ssm.conv_kernel"),
    Key("d_state", "ssm.state_size"),
    Key("n_group", "ssm.group_count"),
    Key("dt_rank", "ssm.time_step_rank"),
    Key("d_inner", "ssm.inner_size"),
    Key("attn_interval", "full_attention_interval", 4),
    Key("n_nextn", "nextn_predict_layers", 0),
    Key("recurrent_layers", "attention.recurrent_layers", (), tuple),  # per block: 1 DeltaNet
)

_OPTIONAL = False  # Tensor.required: each of these is in one kind of layer (check_layers)
TENSORS = (
    Tensor("attn_norm", "attn_norm.weight", ("n_embd",)),
    Tensor("ffn_norm", "post_attention_norm.weight", ("n_embd",)),
    Tensor("w_gate", "ffn_gate.weight", ("n_embd", "n_ff")),
    Tensor("w_up", "ffn_up.weight", ("n_embd", "n_ff")),
    Tensor("w_down", "ffn_down.weight", ("n_ff", "n_embd")),
    Tensor("wq", "attn_q.weight", ("n_embd", "qg_dim"), _OPTIONAL),
    Tensor("wk", "attn_k.weight", ("n_embd", "kv_dim"), _OPTIONAL),
    Tensor("wv", "attn_v.weight", ("n_embd", "kv_dim"), _OPTIONAL),
    Tensor("wo", "attn_output.weight", ("q_dim", "n_embd"), _OPTIONAL),
    Tensor("q_norm", "attn_q_norm.weight", ("head_dim",), _OPTIONAL),
    Tensor("k_norm", "attn_k_norm.weight", ("head_dim",), _OPTIONAL),
    Tensor("wqkv", "attn_qkv.weight", ("n_embd", "ssm_conv_dim"), _OPTIONAL),
    Tensor("wz", "attn_gate.weight", ("n_embd", "ssm_v_dim"), _OPTIONAL),
    Tensor("w_beta", "ssm_beta.weight", ("n_embd", "dt_rank"), _OPTIONAL),
    Tensor("w_alpha", "ssm_alpha.weight", ("n_embd", "dt_rank"), _OPTIONAL),
    Tensor("conv", "ssm_conv1d.weight", ("d_conv", "ssm_conv_dim"), _OPTIONAL, floats=True),
    Tensor("dt_bias", "ssm_dt.bias", ("dt_rank",), _OPTIONAL),
    Tensor("ssm_a", "ssm_a", ("dt_rank",), _OPTIONAL),
    Tensor("ssm_norm", "ssm_norm.weight", ("d_state",), _OPTIONAL),
    Tensor("ssm_out", "ssm_out.weight", ("ssm_v_dim", "n_embd"), _OPTIONAL),
)
ATTENTION_FIELDS = ("wq", "wk", "wv", "wo", "q_norm", "k_norm")
RECURRENT_FIELDS = ("wqkv", "wz", "w_beta", "w_alpha", "conv", "dt_bias", "ssm_a", "ssm_norm",
                    "ssm_out")


def finish(v: KeyValues) -> None:
    """llama's checks and the DeltaNet's shapes: value heads share key heads evenly, and a
    value head is as wide as a key head (llama.cpp asserts both)."""
    llama.finish(v)
    if not 0 <= v["n_nextn"] < v["n_layer"]:
        v.refuse(f"{v.arch}.nextn_predict_layers = {v['n_nextn']} of {v['n_layer']} blocks")
    v["n_layer"] -= v["n_nextn"]  # the trunk: the last blocks are a draft head, not run here
    if v["recurrent_layers"] and len(v["recurrent_layers"]) < v["n_layer"]:
        v.refuse(f"{v.arch}.attention.recurrent_layers has {len(v['recurrent_layers'])} entries "
                 f"for {v['n_layer']} blocks")
    for name in ("d_conv", "d_state", "n_group", "dt_rank", "attn_interval"):
        if v[name] <= 0:
            v.refuse(f"{v.arch}: {name} = {v[name]} must be > 0")
    if v["dt_rank"] % v["n_group"]:
        v.refuse(f"{v.arch}: {v['dt_rank']} value heads cannot share {v['n_group']} key heads")
    if v["d_inner"] != v["dt_rank"] * v["d_state"]:
        v.refuse(f"{v.arch}.ssm.inner_size {v['d_inner']} is not time_step_rank * state_size "
                 "(value heads as wide as key heads)")
    v["qg_dim"] = 2 * v["n_head"] * v["head_dim"]
    v["ssm_v_dim"] = v["d_inner"]
    v["ssm_conv_dim"] = 2 * v["n_group"] * v["d_state"] + v["d_inner"]


def skips(hp: HParams, name: str) -> bool:
    """The multi-token-prediction blocks after the trunk (blk.{n_layer}. and on): llama.cpp
    runs them only as a speculative draft, which the engine does not."""
    if not name.startswith("blk."):
        return False
    block = name.split(".", 2)[1]
    return block.isdigit() and int(block) >= hp.n_layer


def is_recurrent(hp: HParams, layer: int) -> bool:
    """attention.recurrent_layers when the file has it (the converter writes it from the
    model's layer_types), else every layer but each full_attention_interval-th."""
    marks = hp.extra.get("recurrent_layers")
    if isinstance(marks, tuple) and marks:
        return bool(marks[layer])
    return (layer + 1) % hp.dim("attn_interval") != 0


def recurrent_shape(hp: HParams) -> RecurrentShape:
    return RecurrentShape(tuple(i for i in range(hp.n_layer) if is_recurrent(hp, i)),
                          hp.dim("d_conv") - 1, hp.dim("ssm_conv_dim"), hp.dim("dt_rank"),
                          hp.dim("d_state"), hp.dim("d_state"))


def check_layers(hp: HParams, layers: list[Qwen35Layer]) -> str | None:
    """Why the layers do not fit the interleave, or None: each layer has its kind's tensors
    and none of the other kind's."""
    for i, w in enumerate(layers):
        need, other = ((RECURRENT_FIELDS, ATTENTION_FIELDS) if is_recurrent(hp, i)
                       else (ATTENTION_FIELDS, RECURRENT_FIELDS))
        kind = "a DeltaNet" if is_recurrent(hp, i) else "an attention"
        missing = [f for f in need if getattr(w, f) is None]
        extra = [f for f in other if getattr(w, f) is not None]
        if missing:
            return f"layer {i} is {kind} layer but lacks its {missing[0]} tensor"
        if extra:
            return f"layer {i} is {kind} layer but has a {extra[0]} tensor"
    return None


def block(b: Builder, w: Qwen35Layer, layer: int) -> None:
    b.add_norm(w.attn_norm)                                   # x += o; h = rms_norm(x) * attn_norm
    if w.ssm_a is not None:
        b.delta_net(layer, delta_weights(w), dims(b.hp))     # o = DeltaNet(h), state updated
    else:
        assert w.wq is not None and w.wk is not None and w.wv is not None and w.wo is not None
        assert w.q_norm is not None and w.k_norm is not None
        b.project("h", [(w.wq, "qg"), (w.wk, "k"), (w.wv, "v")])  # [q; gate] per head, k, v
        b.split_gate()                                        # q, gate = qg's halves per head
        b.head_norm("q", w.q_norm)
        b.head_norm("k", w.k_norm)
        b.rope_store(layer)                                   # rope q, k; k, v -> cache
        b.attention(layer)                                    # q = attention(q, cache)
        b.apply_gate()                                        # q *= sigmoid(gate)
        b.project("q", [(w.wo, "o")])
    b.add_norm(w.ffn_norm)                                    # x += o; h = rms_norm(x) * post_attention_norm
    b.project("h", [(w.w_gate, "g"), (w.w_up, "u")])
    b.glu("silu")
    b.project("g", [(w.w_down, "o")])


def delta_weights(w: Qwen35Layer) -> DeltaNetWeights:
    """A DeltaNet layer's tensors (check_layers made sure it has them all)."""
    parts = [getattr(w, f) for f in RECURRENT_FIELDS]
    assert all(p is not None for p in parts)
    return DeltaNetWeights(*parts)


def dims(hp: HParams) -> DeltaNetDims:
    return DeltaNetDims(hp.dim("n_group"), hp.dim("dt_rank"), hp.dim("d_state"), hp.rms_eps)


SPEC = ArchSpec("qwen35", KEYS, finish, Qwen35Layer, TENSORS, block, rope_neox=True,
                recurrent=recurrent_shape, skips=skips, check_layers=check_layers)
