"""One module per architecture family; SPECS maps general.architecture to its ArchSpec."""
from __future__ import annotations

from . import gemma, llama, phi3, qwen
from .base import ArchSpec, Builder, LayerWeights

SPECS: dict[str, ArchSpec] = {s.name: s for s in (
    llama.SPEC, qwen.QWEN2, qwen.QWEN3, phi3.SPEC, gemma.GEMMA2, gemma.GEMMA3)}

__all__ = ["ArchSpec", "Builder", "LayerWeights", "SPECS"]
