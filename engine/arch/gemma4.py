"""gemma4 (Gemma 4 E2B / E4B and the dense 31B): gemma3's sandwich block with per-layer
embeddings, KV shared between layers, two head dims and a scaled layer output.

    x = embed(tokens) * sqrt(n_embd)
    per-layer inputs (PLE), once per token, for each layer l:
        p_l = rms_norm((x @ Wple_model.T)[l] / sqrt(n_embd)) * ple_proj_norm
        p_l = (p_l + ple_token_embd[token][l] * sqrt(n_pl)) / sqrt(2)      [n_pl]
    each layer:
        h = rms_norm(x) * attn_norm
        q = rms_norm_heads(h @ Wq) * q_norm;  rope (its kind's base, rotated dims, factors)
        layers that keep a cache:  k = rms_norm_heads(h @ Wk) * k_norm, v = rms_norm_heads(h @ Wv)
                                   (no weight; Wv absent: Wk's projection), rope k, store
        layers past the first n_layer - shared_kv_layers read the cache of the last earlier
        layer of their kind instead (llama.cpp's reuse: n_kv - 2 for sliding, n_kv - 1 for full)
        x += rms_norm(attention(q, cache) @ Wo) * post_attention_norm     (scale 1)
        x += rms_norm(ffn(rms_norm(x) * ffn_norm)) * post_ffw_norm          (gelu_tanh)
        x += rms_norm((gelu_tanh(x @ Winp_gate) * p_l) @ Wproj) * post_norm   (PLE)
        x *= layer_output_scale
    logits = softcap(rms_norm(x) * output_norm @ Wout, final_logit_softcapping)

Sliding-window layers follow the file's sliding_window_pattern and have their own head dim
(key_length_swa), rotated dims and rope base; the full layers' rope has per-frequency factors
(rope_freqs: 1e30 leaves a pair unrotated, Gemma 4's "proportional" rope). llama.cpp's
src/models/gemma4.cpp (graph, build_inp_per_layer, project_per_layer_inputs) and
src/llama-model.cpp (the KV reuse callback). The mixture-of-experts variant (26B-A4B, its
ffn_gate_inp and experts) is refused at load: its tensors are not declared here.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formats import quants
from . import llama
from .base import ArchSpec, Builder, Layer
from .declare import Key, KeyValues, Tensor

_F32 = np.float32


@dataclass(kw_only=True)
class Gemma4Layer(Layer):
    attn_norm: np.ndarray               # float32 [n_embd]
    wq: quants.QuantMatrix              # [q_dim of this layer, n_embd]
    wo: quants.QuantMatrix              # [n_embd, q_dim]
    q_norm: np.ndarray                  # float32 [head_dim of this layer]
    post_attn_norm: np.ndarray          # float32 [n_embd]
    ffn_norm: np.ndarray                # float32 [n_embd]
    w_gate: quants.QuantMatrix          # [n_ff, n_embd]
    w_up: quants.QuantMatrix            # [n_ff, n_embd]
    w_down: quants.QuantMatrix          # [n_embd, n_ff]
    post_ffn_norm: np.ndarray           # float32 [n_embd]
    wk: quants.QuantMatrix | None = None     # [kv_dim, n_embd]; None: reads another's cache
    wv: quants.QuantMatrix | None = None     # [kv_dim, n_embd]; None: v from Wk
    k_norm: np.ndarray | None = None         # float32 [head_dim]
    ple_gate: quants.QuantMatrix | None = None  # [n_embd_per_layer, n_embd] inp_gate
    ple_proj: quants.QuantMatrix | None = None  # [n_embd, n_embd_per_layer] proj
    ple_norm: np.ndarray | None = None       # float32 [n_embd] post_norm
    out_scale: np.ndarray | None = None      # float32 [1] layer_output_scale


TENSORS = (
    Tensor("attn_norm", "attn_norm.weight", ("n_embd",)),
    Tensor("wq", "attn_q.weight", ("n_embd", "q_dim")),
    Tensor("wk", "attn_k.weight", ("n_embd", "kv_dim"), required=False),
    Tensor("wv", "attn_v.weight", ("n_embd", "kv_dim"), required=False),
    Tensor("wo", "attn_output.weight", ("q_dim", "n_embd")),
    Tensor("q_norm", "attn_q_norm.weight", ("head_dim",)),
    Tensor("k_norm", "attn_k_norm.weight", ("head_dim",), required=False),
    Tensor("post_attn_norm", "post_attention_norm.weight", ("n_embd",)),
    Tensor("ffn_norm", "ffn_norm.weight", ("n_embd",)),
    Tensor("w_gate", "ffn_gate.weight", ("n_embd", "n_ff")),
    Tensor("w_up", "ffn_up.weight", ("n_embd", "n_ff")),
    Tensor("w_down", "ffn_down.weight", ("n_ff", "n_embd")),
    Tensor("post_ffn_norm", "post_ffw_norm.weight", ("n_embd",)),
    Tensor("ple_gate", "inp_gate.weight", ("n_embd", "n_embd_per_layer"), required=False),
    Tensor("ple_proj", "proj.weight", ("n_embd_per_layer", "n_embd"), required=False),
    Tensor("ple_norm", "post_norm.weight", ("n_embd",), required=False),
    Tensor("out_scale", "layer_output_scale.weight", ("1",), required=False),
)
GLOBALS = (  # the per-layer embeddings' model-level tensors (Weights.extra)
    Tensor("ple_embd", "per_layer_token_embd.weight", ("n_ple", "n_vocab"), required=False),
    Tensor("ple_model_proj", "per_layer_model_proj.weight", ("n_embd", "n_ple"), required=False),
    Tensor("ple_proj_norm", "per_layer_proj_norm.weight", ("n_embd_per_layer",), required=False),
)

PER_LAYER = ("n_ff", "n_head_kv")  # arrays in files whose layers differ (the converter writes
#                                   them for double-wide MLPs and the full layers' KV heads)
KEYS = tuple(Key(k.name, k.gguf, k.default, tuple) if k.name in PER_LAYER else k
             for k in llama.KEYS) + (
    Key("window", "attention.sliding_window", 0),
    Key("swa_pattern", "attention.sliding_window_pattern", None, tuple),
    Key("n_kv_shared", "attention.shared_kv_layers", 0),
    Key("n_embd_per_layer", "embedding_length_per_layer_input", 0),
    Key("head_dim_swa", "attention.key_length_swa", lambda v: v["head_dim"]),
    Key("value_dim_swa", "attention.value_length_swa", lambda v: v["head_dim_swa"]),
    Key("n_rot_swa", "rope.dimension_count_swa", lambda v: v["n_rot"]),
    Key("rope_base_swa", "rope.freq_base_swa", lambda v: v["rope_base"], float),
    Key("final_softcap", "final_logit_softcapping", 0.0, float),
)


def finish(v: KeyValues) -> None:
    """llama's checks, then llama.cpp's gemma4 facts: the pattern's layers slide, the shared
    layers' sources, attention scale 1, the embedding scale sqrtf(n_embd); per-layer FFN widths
    and KV head counts as HParams.n_ff_layers / n_head_kv_layers."""
    n_layer = v["n_layer"]
    for name in PER_LAYER:
        values = v[name] * n_layer if len(v[name]) == 1 else v[name]
        if len(values) != n_layer or not all(isinstance(x, int) and x > 0 for x in values):
            v.refuse(f"{v.arch}: {name} {list(v[name])} is not one value > 0 per layer")
        v[name] = max(values)
        if len(set(values)) > 1:
            v[f"{name}_layers"] = tuple(values)
    llama.finish(v)
    if v.pop("value_dim_swa") != v["head_dim_swa"]:
        v.refuse(f"{v.arch}.attention.value_length_swa differs from key_length_swa")
    if v["window"] < 0:
        v.refuse(f"{v.arch}.attention.sliding_window = {v['window']} must be >= 0")
    pattern = v["swa_pattern"]
    if len(pattern) != n_layer:
        v.refuse(f"{v.arch}.attention.sliding_window_pattern has {len(pattern)} layers, "
                 f"the model {n_layer}")
    v["swa_pattern"] = pattern = tuple(bool(x) for x in pattern)
    shared = v.pop("n_kv_shared")
    first = n_layer - shared  # layers [first, n_layer) keep no cache
    if shared:
        if not 2 <= first <= n_layer or pattern[first - 1] or not pattern[first - 2]:
            v.refuse(f"{v.arch}.attention.shared_kv_layers = {shared}: the two layers before "
                     "the shared ones must be a sliding and a full one (llama.cpp's reuse)")
        v["kv_from"] = tuple(li if li < first else first - (2 if pattern[li] else 1)
                             for li in range(n_layer))
    if v["n_embd_per_layer"] < 0:
        v.refuse(f"{v.arch}.embedding_length_per_layer_input must be >= 0")
    v["n_ple"] = n_layer * v["n_embd_per_layer"]
    if v["final_softcap"] < 0:
        v.refuse(f"{v.arch}.final_logit_softcapping = {v['final_softcap']} must be >= 0")
    v["rope_freq_scale_swa"] = v["rope_freq_scale"]
    v["attn_scale"] = 1.0
    v["embed_scale"] = float(_F32(np.sqrt(_F32(v["n_embd"]))))


@functools.cache
def _ones(n: int) -> np.ndarray:
    """float32 [n] of 1: v's RMS norm has no weight (kept alive here: graphs point at it)."""
    return np.ones(n, _F32)


def _inv_sqrt(n: float) -> float:
    return float(_F32(1) / _F32(np.sqrt(_F32(n))))  # 1.0f / sqrtf(n)


def token_inputs(extra: Mapping[str, Any], hp: Any, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Each layer's token embedding rows, ple_tok{l}: per_layer_token_embd[ids] * sqrt(n_pl),
    float32 [T, n_pl] (an embedded position looks up id 0, llama.cpp's padding row)."""
    table = extra.get("ple_embd")
    if table is None:
        return {}
    n_pl = hp.dim("n_embd_per_layer")
    rows = quants.dequantize(table.raw[ids], table.qtype, table.n_cols)      # [T, n_layer * n_pl]
    rows *= _F32(np.sqrt(_F32(n_pl)))
    return {f"ple_tok{li}": np.ascontiguousarray(rows[:, li * n_pl:(li + 1) * n_pl])
            for li in range(hp.n_layer)}


def prologue(b: Builder, extra: Mapping[str, Any]) -> None:
    """ple{l} = (rms_norm(x @ Wple_model[l].T / sqrt(n_embd)) * norm + ple_tok{l}) / sqrt(2),
    from the scaled embedding rows, before layer 0 changes them."""
    proj = extra.get("ple_model_proj")
    if proj is None:
        return
    hp, n_pl = b.hp, b.hp.dim("n_embd_per_layer")
    b.project("x", [(quants.QuantMatrix(proj.raw[li * n_pl:(li + 1) * n_pl], proj.qtype, n_pl,
                                        proj.n_cols), f"ple{li}") for li in range(hp.n_layer)])
    for li in range(hp.n_layer):
        b.scale(f"ple{li}", _inv_sqrt(hp.n_embd))
        b.norm(f"ple{li}", extra["ple_proj_norm"])
        b.add(f"ple{li}", f"ple_tok{li}")
        b.scale(f"ple{li}", _inv_sqrt(2))


def block(b: Builder, w: Gemma4Layer, layer: int) -> None:
    b.add_norm(w.attn_norm)                                   # x += o; h = rms_norm(x) * attn_norm
    if b.hp.has_kv(layer):
        if w.wk is None or w.k_norm is None:
            raise ValueError(f"gemma4 layer {layer} keeps a KV cache but has no attn_k")
        b.project("h", [(w.wq, "q"), (w.wk, "k"), (w.wv or w.wk, "v")])
        b.head_norm("q", w.q_norm)
        b.head_norm("k", w.k_norm)
        b.head_norm("v", _ones(b.hp.layer_head_dim(layer)))  # v: RMS norm without weight
        b.rope_store(layer)                                   # rope q, k; k, v -> cache
    else:                                                     # reads an earlier layer's cache
        b.project("h", [(w.wq, "q")])
        b.head_norm("q", w.q_norm)
        b.rope_q(layer)
    b.attention(layer)                                        # q = attention(q, cache), scale 1
    b.project("q", [(w.wo, "o")])
    b.norm("o", w.post_attn_norm)                             # o = rms_norm(o) * post_attention_norm
    b.add_norm(w.ffn_norm)                                    # x += o; h = rms_norm(x) * ffn_norm
    b.project("h", [(w.w_gate, "g"), (w.w_up, "u")])
    b.glu("gelu_tanh")                                        # g = gelu_tanh(g) * u
    b.project("g", [(w.w_down, "o")])
    b.norm("o", w.post_ffn_norm)                              # o = rms_norm(o) * post_ffw_norm
    if w.ple_gate is not None and w.ple_proj is not None and w.ple_norm is not None:
        b.add_residual()                                      # x += o
        b.project("x", [(w.ple_gate, "ple_g")])
        b.glu("gelu_tanh", "ple_g", f"ple{layer}")            # gelu_tanh(x @ Wgate) * p_l
        b.project("ple_g", [(w.ple_proj, "o")])
        b.norm("o", w.ple_norm)                               # o = rms_norm(o @ Wproj) * post_norm
    b.add_residual(1.0 if w.out_scale is None else float(w.out_scale[0]))  # x = (x + o) * scale


SPEC = ArchSpec("gemma4", KEYS, finish, Gemma4Layer, TENSORS, block, rope_neox=True,
                raw_spans=True, globals=GLOBALS, prologue=prologue, token_inputs=token_inputs)
