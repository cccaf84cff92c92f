"""gemma2 and gemma3: the sandwich block, each sublayer normed on both sides.

    x = embed(tokens) * sqrt(n_embd)
    h = x + rms_norm(attention(rms_norm(x) * attn_norm)) * post_attention_norm
    x = h + rms_norm(ffn(rms_norm(h) * ffn_norm)) * post_ffw_norm,   ffn with gelu_tanh

Local (sliding-window) layers alternate with global ones: gemma2 every other layer, gemma3 five
of every six, with their own rope base. gemma3 norms q and k per head; gemma2 softcaps the
attention scores and the final logits instead.
"""
from __future__ import annotations

from dataclasses import replace

from . import llama
from .base import ArchSpec, Builder, LayerWeights


def block(b: Builder, w: LayerWeights, layer: int) -> None:
    assert w.post_attn_norm is not None and w.post_ffn_norm is not None
    b.add_norm(w.attn_norm)                                   # x += o; h = rms_norm(x) * attn_norm
    llama.attention(b, w, layer, scale_q_first=True)          # o = attention(h) @ Wo
    b.norm("o", w.post_attn_norm)                             # o = rms_norm(o) * post_attention_norm
    b.add_norm(w.ffn_norm)                                    # x += o; h = rms_norm(x) * ffn_norm
    llama.ffn(b, w, "gelu_tanh")                              # o = ffn(h)
    b.norm("o", w.post_ffn_norm)                              # o = rms_norm(o) * post_ffw_norm


_GEMMA = ArchSpec("gemma", block, rope_neox=True, post_norms=True, embed_scale=True, ffn_act="gelu_tanh")
GEMMA2 = replace(_GEMMA, name="gemma2", swa_period=2, attn_softcap=True, final_softcap=True,
                 embd_scale_layers=(46,))
GEMMA3 = replace(_GEMMA, name="gemma3", qk_norm=True, swa_period=6, swa_rope_base=10000.0,
                 final_softcap=True, embd_scale_layers=(62,))
