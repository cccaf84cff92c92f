"""One slot's content as a file: llama.cpp's `/slots/{id}?action=save|restore`.

The same container as the pool's block files (disk.py: magic, JSON header, aligned arrays,
written atomically), holding the slot's position keys, its ring high-water mark and per cache
group the rows it holds: [0, n) of a full-attention group, the whole ring of a sliding-window
one (the ring holds the slot's last positions). A recurrent family's state is not saved (a
SlotFileError: its checkpoints are not rows). Restoring checks the fingerprint (the model file
and the settings that change the rows) and every array's layout before a row is written, so a
file of another model or of other settings changes nothing.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..kv import KVCache
from .disk import _keys_from_json, _keys_json, encode, map_arrays, read_header, write_atomic


class SlotFileError(Exception):
    """The slot cannot be saved, or the file cannot be restored (the message says why)."""


def _rows(cache: KVCache, g: int, n: int) -> slice:
    return slice(None) if cache.layout.groups[g].is_ring else slice(0, n)


def save_slot(cache: KVCache, slot: int, path: str | os.PathLike[str],
              fingerprint: str) -> tuple[int, int]:
    """Write the slot's content to `path`; (positions saved, bytes written)."""
    if cache.recurrent is not None:
        raise SlotFileError("a recurrent model's slot state cannot be saved")
    n = len(cache.tokens[slot])
    arrays = [a[slot, :, _rows(cache, g % len(cache.k), n)]
              for g, a in enumerate((*cache.k, *cache.v))]
    header = {"fingerprint": fingerprint, "kind": "slot", "keys": _keys_json(tuple(cache.tokens[slot])),
              "written": cache.written[slot]}
    try:
        size = write_atomic(Path(path), encode(header, arrays))
    except OSError as exc:
        raise SlotFileError(f"cannot write the slot file: {exc.strerror or exc}") from exc
    return n, size


def restore_slot(cache: KVCache, slot: int, path: str | os.PathLike[str],
                 fingerprint: str) -> tuple[int, int]:
    """Put the file's content in the slot; (positions restored, bytes read)."""
    if cache.recurrent is not None:
        raise SlotFileError("a recurrent model's slot state cannot be restored")
    p = Path(path)
    try:
        header, start = read_header(p)
        if header.get("kind") != "slot":
            raise SlotFileError("not a slot file")
        if header.get("fingerprint") != fingerprint:
            raise SlotFileError("the file was saved by another model or other settings")
        keys = list(_keys_from_json(header["keys"]))
        written = int(header["written"])
        if len(keys) > cache.n_ctx or not len(keys) <= written <= cache.n_ctx + cache.n_ctx:
            raise SlotFileError("the file holds more positions than the context")
        arrays = map_arrays(p, header, start)
    except SlotFileError:
        raise
    except FileNotFoundError as exc:
        raise SlotFileError("no such file") from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SlotFileError(f"the file is not a readable slot file ({exc})") from exc
    targets = [(a, _rows(cache, g % len(cache.k), len(keys)))
               for g, a in enumerate((*cache.k, *cache.v))]
    if len(arrays) != len(targets) or any(
            src.shape != dst[slot, :, rows].shape or src.dtype != dst.dtype
            for src, (dst, rows) in zip(arrays, targets)):
        raise SlotFileError("the file's rows do not fit this model's cache")
    for src, (dst, rows) in zip(arrays, targets):
        dst[slot, :, rows] = src
    cache.tokens[slot] = keys
    cache.written[slot] = written
    return len(keys), p.stat().st_size
