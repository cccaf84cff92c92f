"""A block: BLOCK consecutive positions of a prefix, their keys and their K/V rows.

A block is named by its chain hash: the hash of its parent's name and its own position keys,
so one name stands for the whole prefix up to the block's end. The name only finds a block;
the keys it stores are compared with the prompt's before its rows are used (a hash collision,
or a file written by someone else, cannot put wrong rows in a slot).

A block holding fewer than BLOCK positions is a tail: the end of a prompt that did not fill a
block. It has no children, and a longer tail of the same parent replaces it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ..prompt import PositionKey

BLOCK = 256  # positions per block: a 6k-token system prompt is 24 of them


def encode_keys(keys: tuple[PositionKey, ...]) -> bytes:
    """Position keys as bytes, the same in every process (token ids as int64, else their repr)."""
    if all(isinstance(k, int) for k in keys):
        return b"i" + np.asarray(keys, np.int64).tobytes()
    return b"r" + repr(keys).encode()


def chain_hash(parent: bytes, keys: tuple[PositionKey, ...]) -> bytes:
    """The name of the block holding `keys` after the prefix named `parent` (b"": none)."""
    return hashlib.blake2b(parent + encode_keys(keys), digest_size=16).digest()


@dataclass(eq=False)
class Block:
    """BLOCK positions (fewer: a tail) of one prefix. k, v: per cache group of the model,
    [layers of the group, positions, kv_head, head_dim] f16 (or uint8 row bytes for a quantized
    type); None while the block is only on disk (`path`)."""
    name: bytes                        # chain_hash(parent, keys)
    parent: bytes
    keys: tuple[PositionKey, ...]
    k: list[np.ndarray] | None
    v: list[np.ndarray] | None
    nbytes: int                        # of k and v, whether held or not
    path: str | None = None            # its file, once written (engine.prompt_cache.disk)
    mapped: bool = field(default=False)  # k, v are views of `path`'s mapping

    @property
    def full(self) -> bool:
        return len(self.keys) == BLOCK

    @property
    def in_ram(self) -> bool:
        return self.k is not None
