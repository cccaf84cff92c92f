"""qwen3moe: qwen3's attention (NEOX rope, per-head q/k norms) with a mixture of experts for FFN.

    h = rms_norm(x) * ffn_norm
    p = softmax(h @ Wrouter) over all n_expert experts; the n_expert_used largest, renormalised
    x += sum over those experts e of p_e * (silu(h @ Wgate_e) * (h @ Wup_e)) @ Wdown_e

llama.cpp's src/models/qwen3moe.cpp (build_moe_ffn with softmax gating, norm_w, no shared
expert). The experts are stacked 3-D tensors (ffn_{gate,up,down}_exps, [n_expert, rows, cols]);
the Builder runs each chosen expert once over all the tokens that chose it (engine.kernels.moe).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..formats import quants
from . import llama
from .base import ArchSpec, Builder
from .declare import Key, KeyValues, Tensor


@dataclass(kw_only=True)
class Qwen3MoeLayer(llama.AttentionLayer):
    router: quants.QuantMatrix          # [n_expert, n_embd]
    gate_exps: quants.StackedMatrix     # [n_expert][n_ff_exp, n_embd]
    up_exps: quants.StackedMatrix       # [n_expert][n_ff_exp, n_embd]
    down_exps: quants.StackedMatrix     # [n_expert][n_embd, n_ff_exp]


KEYS = llama.KEYS + (
    Key("n_expert", "expert_count"),
    Key("n_expert_used", "expert_used_count"),
    Key("n_ff_exp", "expert_feed_forward_length"),
)
TENSORS = llama.ATTENTION_TENSORS + llama.QK_NORM + (
    Tensor("router", "ffn_gate_inp.weight", ("n_embd", "n_expert")),
    Tensor("gate_exps", "ffn_gate_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    Tensor("up_exps", "ffn_up_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    Tensor("down_exps", "ffn_down_exps.weight", ("n_ff_exp", "n_embd", "n_expert")),
)


def finish(v: KeyValues) -> None:
    llama.finish(v)
    n_expert, n_used = v["n_expert"], v["n_expert_used"]
    if not 0 < n_used <= n_expert:
        v.refuse(f"{v.arch}: {n_used} experts used of {n_expert} (need 0 < used <= count)")
    if v["n_ff_exp"] <= 0:
        v.refuse(f"{v.arch}.expert_feed_forward_length = {v['n_ff_exp']} must be > 0")


def block(b: Builder, w: Qwen3MoeLayer, layer: int) -> None:
    b.add_norm(w.attn_norm)                                   # x += o; h = rms_norm(x) * attn_norm
    llama.attention(b, w, layer)                              # qwen3's, q/k normed per head
    b.add_norm(w.ffn_norm)                                    # x += o; h = rms_norm(x) * ffn_norm
    b.route(w.router, b.hp.dim("n_expert_used"))              # each token's experts and weights
    b.expert_ffn(w.gate_exps, w.up_exps, w.down_exps, "silu")  # o = their weighted SwiGLUs


SPEC = ArchSpec("qwen3moe", KEYS, finish, Qwen3MoeLayer, TENSORS, block, rope_neox=True)
