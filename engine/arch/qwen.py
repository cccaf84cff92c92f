"""qwen2 and qwen3: llama's block with NEOX rope; qwen2 adds q/k/v biases, qwen3 per-head RMS
norms on q and k before rope (and a head_dim that need not be n_embd / n_head)."""
from __future__ import annotations

from . import llama
from .base import ArchSpec

QWEN2 = ArchSpec("qwen2", llama.block, rope_neox=True, qkv_bias=True)
QWEN3 = ArchSpec("qwen3", llama.block, rope_neox=True, qk_norm=True)
