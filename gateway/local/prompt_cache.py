"""An entry's prompt-cache pool (engine/prompt_cache/) and the fingerprint its files carry.

    entry.prompt_cache_bytes > 0 and the model can pool (no rings, no recurrent state)
        -> PromptCachePool(budget) [+ DiskStore(prompt_cache_dir, alias, fingerprint) when
           entry.prompt_cache_disk_bytes > 0: blocks a previous load left come back]

The fingerprint is what changes the rows a prompt writes: the engine's version, the model file
(path, size, mtime), n_ctx, the KV types, flash_attn's numerics, the rope settings, the LoRA
adapters (their files and scales) and the projector (an image's rows). A file written under
any other fingerprint is never read (engine/prompt_cache/disk.py), and the same fingerprint
names a slot file of /slots save and restore (gateway/api/slots.py).
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from engine.prompt_cache import DiskStore, PromptCachePool, poolable
from gateway.version import version

if TYPE_CHECKING:
    from engine.loaded import LoadedModel
    from gateway.config import ModelEntry

log = logging.getLogger("modelyard.prompt_cache")


def _file_id(path: Path | None) -> tuple[str, int, int]:
    if path is None:
        return ("", 0, 0)
    try:
        st = path.stat()
    except OSError:
        return (str(path), 0, 0)
    return (str(path), st.st_size, st.st_mtime_ns)


def fingerprint(entry: ModelEntry, n_ctx: int) -> str:
    parts = (version(), _file_id(entry.model), n_ctx, entry.kv_cache_types, entry.flash_attn,
             entry.rope_freq_base, entry.rope_freq_scale, entry.rope_scaling_type,
             entry.yarn_ext_factor, entry.yarn_attn_factor, entry.yarn_beta_fast,
             entry.yarn_beta_slow, entry.yarn_orig_ctx,
             [(_file_id(a.path), a.scale) for a in entry.lora], _file_id(entry.mmproj))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def default_dir() -> Path:
    root = os.environ.get("MODELYARD_CACHE") or os.path.join(Path.home(), ".cache", "modelyard")
    return Path(root) / "prompt-cache"


def pool_for(entry: ModelEntry, model: LoadedModel) -> PromptCachePool | None:
    """The entry's pool, or None (none configured, or the model cannot pool: logged)."""
    budget = entry.prompt_cache_bytes
    if budget <= 0:
        return None
    cache = getattr(model.transformer, "cache", None)
    why = poolable(cache)
    if why is not None:
        log.info("%s: no prompt cache beyond the slots: %s", entry.name, why)
        return None
    store = None
    if entry.prompt_cache_disk_bytes > 0:
        folder = entry.prompt_cache_dir or default_dir()
        store = DiskStore(folder, entry.name, fingerprint(entry, model.n_ctx),
                          entry.prompt_cache_disk_bytes)
    # restores copy on the model's threads
    pool = PromptCachePool(cache, budget, store, entry.n_threads)  # type: ignore[arg-type]  # poolable
    if len(pool):
        log.info("%s: prompt cache: %d blocks on disk from an earlier load", entry.name, len(pool))
    return pool
