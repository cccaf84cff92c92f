"""llama (and Mistral, which loads as llama): the pre-norm block the other families vary.

    x += attention(rms_norm(x) * attn_norm) @ Wo
    x += (silu(h @ Wgate) * (h @ Wup)) @ Wdown,   h = rms_norm(x) * ffn_norm
"""
from __future__ import annotations

from .base import ArchSpec, Builder, LayerWeights


def attention(b: Builder, w: LayerWeights, layer: int, scale_q_first: bool = False) -> None:
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


def ffn(b: Builder, w: LayerWeights, act: str) -> None:
    """o = (act(h @ Wgate) * (h @ Wup)) @ Wdown."""
    b.project("h", [(w.w_gate, "g"), (w.w_up, "u")])
    b.glu(act)                                                # g = act(g) * u
    b.project("g", [(w.w_down, "o")])


def block(b: Builder, w: LayerWeights, layer: int) -> None:
    b.add_norm(w.attn_norm)                                   # x += o; h = rms_norm(x) * attn_norm
    attention(b, w, layer)
    b.add_norm(w.ffn_norm)                                    # x += o; h = rms_norm(x) * ffn_norm
    ffn(b, w, "silu")


SPEC = ArchSpec("llama", block)
