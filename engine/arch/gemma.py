"""gemma2 and gemma3: the sandwich block, each sublayer normed on both sides.

    x = embed(tokens) * sqrt(n_embd)
    h = x + rms_norm(attention(rms_norm(x) * attn_norm)) * post_attention_norm
    x = h + rms_norm(ffn(rms_norm(h) * ffn_norm)) * post_ffw_norm,   ffn with gelu_tanh

Local (sliding-window) layers alternate with global ones: gemma2 every other layer, gemma3 five
of every six, with their own rope base. gemma3 norms q and k per head; gemma2 softcaps the
attention scores and the final logits instead.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import llama
from .base import ArchSpec, Builder
from .declare import Key, KeyValues, Tensor


@dataclass(kw_only=True)
class GemmaLayer(llama.LlamaLayer):
    post_attn_norm: np.ndarray          # float32 [n_embd]
    post_ffn_norm: np.ndarray           # float32 [n_embd]


TENSORS = llama.TENSORS + (
    Tensor("post_attn_norm", "post_attention_norm.weight", ("n_embd",)),
    Tensor("post_ffn_norm", "post_ffw_norm.weight", ("n_embd",)),
)


def block(b: Builder, w: GemmaLayer, layer: int) -> None:
    b.add_norm(w.attn_norm)                                   # x += o; h = rms_norm(x) * attn_norm
    llama.attention(b, w, layer, scale_q_first=True)          # o = attention(h) @ Wo
    b.norm("o", w.post_attn_norm)                             # o = rms_norm(o) * post_attention_norm
    b.add_norm(w.ffn_norm)                                    # x += o; h = rms_norm(x) * ffn_norm
    llama.ffn(b, w, "gelu_tanh")                              # o = ffn(h)
    b.norm("o", w.post_ffn_norm)                              # o = rms_norm(o) * post_ffw_norm


def _finish(swa_period: int, wide_scale_layers: int) -> Callable[[KeyValues], None]:
    """llama's, then the window's layers and rope base, the softcaps, the embedding scale."""

    def finish(v: KeyValues) -> None:
        llama.finish(v)
        window = v["window"]
        if window < 0:
            v.refuse(f"{v.arch}.attention.sliding_window = {window} must be >= 0")
        v["swa_period"] = swa_period if window else 0  # layer i local: i % period < period - 1
        if not window:
            v["rope_base_swa"] = 0.0
        for name, key in (("attn_softcap", "attn_logit_softcapping"),
                          ("final_softcap", "final_logit_softcapping")):
            if v.get(name, 0.0) < 0:
                v.refuse(f"{v.arch}.{key} = {v[name]} must be >= 0")
        # the 27B's attention scale is 1/sqrt(n_embd/n_head) rather than 1/sqrt(head_dim)
        if v["n_layer"] == wide_scale_layers:
            v["attn_scale"] = 1.0 / math.sqrt(v["n_embd"] // v["n_head"])
        v["embed_scale"] = float(np.float32(np.sqrt(np.float32(v["n_embd"]))))
    return finish


_KEYS = llama.KEYS + (
    Key("window", "attention.sliding_window", 0),
    Key("final_softcap", "final_logit_softcapping", 0.0, float),
)
GEMMA2 = ArchSpec(
    "gemma2", _KEYS + (Key("rope_base_swa", "rope.freq_base_swa", lambda v: v["rope_base"], float),
                       Key("attn_softcap", "attn_logit_softcapping", 0.0, float)),
    _finish(swa_period=2, wide_scale_layers=46), GemmaLayer, TENSORS, block, rope_neox=True)
GEMMA3 = ArchSpec(
    "gemma3", _KEYS + (Key("rope_base_swa", "rope.freq_base_swa", 10000.0, float),),
    _finish(swa_period=6, wide_scale_layers=62), GemmaLayer, TENSORS + llama.QK_NORM, block,
    rope_neox=True, bidirectional_spans=True, raw_spans=True)
