"""phi3: llama's block with NEOX rope and fused tensors: attn_qkv holds rows [q; k; v] and ffn_up
rows [gate; up]. The loader serves them as row ranges of the one matrix (no copy), so the block
is llama's. llama.cpp disables Phi-3's sliding window (its files declare one it does not use),
so the spec has no swa_period and the key is not read. LongRoPE's rope_factors_short/long are
per-frequency divisors, the long ones when n_ctx exceeds rope.scaling.original_context_length."""
from __future__ import annotations

from . import llama
from .base import ArchSpec

SPEC = ArchSpec("phi3", llama.block, rope_neox=True, fused_qkv=True, fused_gate_up=True)
