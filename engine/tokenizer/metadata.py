"""`tokenizer.ggml.*` metadata values read with clear errors (ValueError naming the key)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

K = "tokenizer.ggml."


def str_list(meta: Mapping[str, object], key: str, required: bool) -> list[str] | None:
    v = meta.get(key)
    if v is None:
        if required:
            raise ValueError(f"missing {key}")
        return None
    if not isinstance(v, (list, tuple)) or not all(issubclass(t, str) for t in set(map(type, v))):
        raise ValueError(f"{key} must be a list of strings")
    return list(v)


def num_list(meta: Mapping[str, object], key: str, n: int, kind: type) -> list[Any] | None:
    v = meta.get(key)
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or not all(  # per distinct type: ~100k items here
            issubclass(t, kind) or (kind is float and issubclass(t, int)) for t in set(map(type, v))):
        raise ValueError(f"{key} must be a list of {kind.__name__}")
    if len(v) < n:
        raise ValueError(f"{key} has {len(v)} entries for {n} tokens")
    return list(v)


def flag(meta: Mapping[str, object], key: str, default: bool) -> bool:
    v = meta.get(key)
    if v is None:
        return default
    if not isinstance(v, (bool, int)):
        raise ValueError(f"{key} must be a boolean")
    return bool(v)
