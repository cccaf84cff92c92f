"""qwen2 and qwen3: llama's block with NEOX rope; qwen2 adds q/k/v biases, qwen3 per-head RMS
norms on q and k before rope (and a head_dim that need not be n_embd / n_head)."""
from __future__ import annotations

from dataclasses import replace

from . import llama

QWEN2 = replace(llama.SPEC, name="qwen2", rope_neox=True, tensors=llama.TENSORS + llama.QKV_BIAS)
QWEN3 = replace(llama.SPEC, name="qwen3", rope_neox=True, tensors=llama.TENSORS + llama.QK_NORM)
