"""An entry's LoRA adapters: `lora: [{path, scale}]`, or llama-cpp-python's `lora_path` (one, scale 1).

Each file is checked against the entry's model at config load, by the same reading the engine
loads with (engine.servable.why_not_an_adapter): a missing file, a file that is not a LoRA adapter, or
one made for another base is a `file:line` error on the key that names it.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gateway.config.llama_cpp import LORA_PATH
from gateway.config.problems import Loc, Problems


def lora_adapters(key: str, value: Any, base_dir: Path, loc: Loc,
                  problems: Problems) -> list[tuple[dict[str, Any], Loc]]:
    """The adapters `key` (lora or lora_path) lists, paths resolved, each with where it was."""
    if value is None:
        return []
    if key == LORA_PATH:
        items: list[Any] = [{"path": value}]
        locs = [loc]
    elif isinstance(value, list):
        items, locs = value, [loc + (i,) for i in range(len(value))]
    else:
        problems.add(loc, "must be a list of {path, scale}")
        return []
    out: list[tuple[dict[str, Any], Loc]] = []
    for item, where in zip(items, locs):
        if not isinstance(item, dict) or set(item) - {"path", "scale"}:
            problems.add(where, "must be {path: adapter.gguf, scale: 1.0}")
            continue
        path, scale = item.get("path"), item.get("scale", 1.0)
        path_loc = where if key == LORA_PATH else where + ("path",)
        if not isinstance(path, str) or not path.strip():
            problems.add(path_loc, "must be the path of a LoRA adapter GGUF file (a string)")
            continue
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
            problems.add(where + ("scale",), f"must be a finite number, got {scale!r}")
            continue
        resolved = (base_dir / Path(path).expanduser()).resolve()
        if not resolved.is_file():
            problems.add(path_loc, f"LoRA adapter file not found: {resolved}")
            continue
        out.append(({"path": resolved, "scale": float(scale)}, path_loc))
    return out


def check_adapters(model: Path, adapters: list[tuple[dict[str, Any], Loc]],
                   problems: Problems) -> None:
    """Each adapter's header and tensors against the model's (skipped when the model itself is
    already reported)."""
    from engine.servable import why_not_an_adapter, why_not_servable

    if not model.is_file() or why_not_servable(model) is not None:
        return
    for adapter, where in adapters:
        reason = why_not_an_adapter(model, adapter["path"])
        if reason is not None:
            problems.add(where, f"cannot apply {adapter['path']} to {model.name}: {reason}")
