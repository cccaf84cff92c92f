"""One module per architecture family; SPECS maps general.architecture to its ArchSpec (how a
family is declared and how to add one: engine/arch/base.py's docstring)."""
from __future__ import annotations

from typing import Any

from . import bert, gemma, gemma4, gptoss, llama, phi3, qwen, qwen3moe, qwen35
from .base import ArchSpec, Builder, Layer

SPECS: dict[str, ArchSpec[Any]] = {s.name: s for s in (
    llama.SPEC, qwen.QWEN2, qwen.QWEN3, qwen3moe.SPEC, qwen35.SPEC, gptoss.SPEC, phi3.SPEC,
    gemma.GEMMA2, gemma.GEMMA3, gemma4.SPEC, bert.BERT, bert.NOMIC_BERT)}

__all__ = ["ArchSpec", "Builder", "Layer", "SPECS"]
