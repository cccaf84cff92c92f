"""What a model file says about itself, from its GGUF header alone (never the weights).

Model objects (`GET /v1/models`, llama.cpp's `/props`) describe models that may not be loaded,
so their facts come from here: read once per file version (path, size, mtime) and cached.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.arch import SPECS
from engine.pooling import file_pooling, role_of
from gateway import scan
from gateway.generation import defaults


@dataclass(frozen=True)
class ModelFacts:
    architecture: str | None
    quantization: str | None
    n_params: int | None
    n_ctx_train: int | None
    chat_template: str | None
    sampling: defaults.Sampling
    size_bytes: int
    pooling: str | None = None    # the file's <arch>.pooling_type (engine.pooling)
    encoder: bool = False         # a bert-like family: it embeds, never generates

    def role(self, entry_pooling: str | None) -> str:
        """generation, embedding or rerank, with the entry's pooling over the file's."""
        return role_of(entry_pooling or self.pooling, self.encoder)

    def capabilities(self, entry_pooling: str | None) -> list[str]:
        """What /v1/models and /api/show say it does: ["completion"], ["embedding"], ["rerank"]."""
        role = self.role(entry_pooling)
        return ["completion"] if role == "generation" else [role]


def facts(path: str | os.PathLike[str]) -> ModelFacts:
    """The header's facts about `path`; unknown fields are None (a file that went bad)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return ModelFacts(None, None, None, None, None, defaults.Sampling(), 0)
    return _facts(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _facts(path: str, size: int, mtime_ns: int) -> ModelFacts:
    from engine.gguf import read_header

    found = scan.examine_file(path)
    try:
        metadata: dict[str, Any] = read_header(path)[0]
    except Exception:  # noqa: BLE001 - described as unknown; serving it reports the problem
        metadata = {}
    template = metadata.get("tokenizer.chat_template")
    if isinstance(found, scan.Skipped):
        return ModelFacts(metadata.get("general.architecture"), None, None, None,
                          template if isinstance(template, str) else None,
                          defaults.from_metadata(metadata), size)
    spec = SPECS.get(found.arch)
    return ModelFacts(found.arch, found.quantization, found.n_params, found.n_ctx_train,
                      template if isinstance(template, str) else None,
                      defaults.from_metadata(metadata), size,
                      file_pooling(metadata, found.arch), spec is not None and spec.is_encoder)
