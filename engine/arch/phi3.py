"""phi3: llama's block with NEOX rope and fused tensors: attn_qkv holds rows [q; k; v] and ffn_up
rows [gate; up]. The loader serves them as row ranges of the one matrix (no copy), so the block
is llama's. llama.cpp disables Phi-3's sliding window (its files declare one it does not use),
so phi3 declares no window key. LongRoPE's rope_factors_short/long are per-frequency divisors,
the long ones when n_ctx exceeds rope.scaling.original_context_length (engine/weights.py)."""
from __future__ import annotations

from dataclasses import replace

from . import llama
from .declare import fuse

_FUSED = fuse(fuse(llama.TENSORS, "attn_qkv.weight", "wq", "wk", "wv"),
              "ffn_up.weight", "w_gate", "w_up")
SPEC = replace(llama.SPEC, name="phi3", rope_neox=True, tensors=_FUSED)
