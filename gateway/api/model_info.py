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
    return ModelFacts(found.arch, found.quantization, found.n_params, found.n_ctx_train,
                      template if isinstance(template, str) else None,
                      defaults.from_metadata(metadata), size)
