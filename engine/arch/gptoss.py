"""gpt-oss: attention with biases and per-head sinks, sliding-window on alternate layers, and a
mixture of experts routed on the top-k logits, with biased SwiGLU-OAI experts.

    h = rms_norm(x) * attn_norm
    q, k, v = h @ Wq + bq, h @ Wk + bk, h @ Wv + bv;  rope (NEOX)
    x += attention(q, K, V; sinks) @ Wo + bo          # layers 0, 2, ...: a window of `window`
    h = rms_norm(x) * post_attention_norm
    logits = h @ Wrouter + brouter;  the n_expert_used largest, weights softmax over those
    x += sum over them of w_e * (swiglu_oai(h @ Wgate_e + bg_e, h @ Wup_e + bu_e) @ Wdown_e + bd_e)

llama.cpp's src/models/openai-moe.cpp (build_moe_ffn with SOFTMAX_WEIGHT gating, no norm_w,
LLM_FFN_SWIGLU_OAI_MOE; attention scale 1/sqrt(n_rot)). The experts are usually MXFP4
(engine/formats/quant_mx.py). The released files ask for YaRN rope (factor 32, original
context 4096): llama.finish reads it, and the windowed layers rope as the full ones do
(llama.cpp's rope_freq_scale_train_swa defaults to the full layers' scale).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..formats import quants
from . import llama
from .base import ArchSpec, Builder, ExpertBiases
from .declare import Key, KeyValues, Tensor


@dataclass(kw_only=True)
class GptOssLayer(llama.AttentionLayer):
    bo: np.ndarray                      # float32 [n_embd] attn_output's bias
    sinks: np.ndarray                   # float32 [n_head] each head's sink logit
    router: quants.QuantMatrix          # [n_expert, n_embd]
    router_b: np.ndarray                # float32 [n_expert]
    gate_exps: quants.StackedMatrix     # [n_expert][n_ff_exp, n_embd]
    up_exps: quants.StackedMatrix       # [n_expert][n_ff_exp, n_embd]
    down_exps: quants.StackedMatrix     # [n_expert][n_embd, n_ff_exp]
    gate_exps_b: np.ndarray             # float32 [n_expert, n_ff_exp]
    up_exps_b: np.ndarray               # float32 [n_expert, n_ff_exp]
    down_exps_b: np.ndarray             # float32 [n_expert, n_embd]


KEYS = llama.KEYS + (
    Key("n_expert", "expert_count"),
    Key("n_expert_used", "expert_used_count"),
    Key("n_ff_exp", "expert_feed_forward_length"),
    Key("window", "attention.sliding_window", 0),
)
TENSORS = tuple(t for t in llama.ATTENTION_TENSORS if t.name != "ffn_norm") + llama.QKV_BIAS + (
    Tensor("ffn_norm", "post_attention_norm.weight", ("n_embd",)),  # the MoE's input norm
    Tensor("bo", "attn_output.bias", ("n_embd",)),
    Tensor("sinks", "attn_sinks.weight", ("n_head",)),
    Tensor("router", "ffn_gate_inp.weight", ("n_embd", "n_expert")),
    Tensor("router_b", "ffn_gate_inp.bias", ("n_expert",)),
    Tensor("gate_exps", "ffn_gate_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    Tensor("up_exps", "ffn_up_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    Tensor("down_exps", "ffn_down_exps.weight", ("n_ff_exp", "n_embd", "n_expert")),
    Tensor("gate_exps_b", "ffn_gate_exps.bias", ("n_ff_exp", "n_expert"), floats=True),
    Tensor("up_exps_b", "ffn_up_exps.bias", ("n_ff_exp", "n_expert"), floats=True),
    Tensor("down_exps_b", "ffn_down_exps.bias", ("n_embd", "n_expert"), floats=True),
)


def finish(v: KeyValues) -> None:
    """llama's checks, the experts', and llama.cpp's facts: SWA on every other layer (0, 2, ...)
    with the full layers' rope base and scale, attention scale 1/sqrt(n_rot)."""
    llama.finish(v)
    n_expert, n_used = v["n_expert"], v["n_expert_used"]
    if not 0 < n_used <= n_expert:
        v.refuse(f"{v.arch}: {n_used} experts used of {n_expert} (need 0 < used <= count)")
    if v["n_ff_exp"] <= 0:
        v.refuse(f"{v.arch}.expert_feed_forward_length = {v['n_ff_exp']} must be > 0")
    if v["window"] < 0:
        v.refuse(f"{v.arch}.attention.sliding_window = {v['window']} must be >= 0")
    v["swa_period"] = 2 if v["window"] else 0
    v["rope_base_swa"] = v["rope_base"]
    v["rope_freq_scale_swa"] = v["rope_freq_scale"]
    v["attn_scale"] = 1.0 / math.sqrt(v["n_rot"])


def block(b: Builder, w: GptOssLayer, layer: int) -> None:
    b.add_norm(w.attn_norm)                                   # x += o; h = rms_norm(x) * attn_norm
    b.project("h", [(w.wq, "q"), (w.wk, "k"), (w.wv, "v")])   # q, k, v = h @ Wq, Wk, Wv
    for buf, bias in (("q", w.bq), ("k", w.bk), ("v", w.bv)):
        assert bias is not None  # declared required here
        b.add_bias(buf, bias)                                 # + bq, bk, bv
    b.rope_store(layer)                                       # rope q, k; k, v -> cache
    b.attention(layer, sinks=w.sinks)                         # q = attention(q, cache; sinks)
    b.project("q", [(w.wo, "o")])
    b.add_bias("o", w.bo)                                     # o = q @ Wo + bo
    b.add_norm(w.ffn_norm)                                    # x += o; h = rms_norm(x) * post_attention_norm
    b.route(w.router, b.hp.dim("n_expert_used"), bias=w.router_b, gating="softmax_topk")
    b.expert_ffn(w.gate_exps, w.up_exps, w.down_exps, "swiglu_oai",
                 ExpertBiases(w.gate_exps_b, w.up_exps_b, w.down_exps_b))


SPEC = ArchSpec("gpt-oss", KEYS, finish, GptOssLayer, TENSORS, block, rope_neox=True,
                attn_sinks=True)
