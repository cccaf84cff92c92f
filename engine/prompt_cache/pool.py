"""A model's prompt-cache pool: KV prefixes beyond its slots, as a tree of blocks.

Slots hold what their last sequences read; the pool holds more: the prefixes slots held before
they were overwritten, in blocks of BLOCK positions keyed by their position keys (blocks.py), so
a system prompt and tool list shared by many conversations is held once, and a third
conversation on two slots still finds its history. At admission (`take`) a sequence gets the
longer of what its slot holds and what the pool holds, copied into its slot; before a slot is
overwritten (`save`) its full blocks and its tail go into the pool. The pool is bounded in bytes
(`budget`); the least recently used blocks go first, a block's descendants before it (a lookup
touches the deepest block first, its ancestors after), and a dropped block takes its descendants
with it (they cannot be reached without it).

A block's life (one writer: the model's scheduler thread; close() after it stopped):

      slot rows --save--> RAM ---------------- lookup hit: rows copied into a slot (a copy: a
                          |  ^                 slot never pins a block; the block stays)
             spill (the   |  | lookup hit: the file is mapped again (mmap, no read)
             model closes)v  |
                       RAM + DISK --budget trim--> DISK --disk LRU, stale fingerprint, corrupt--> gone
                          |                         ^
                          +---budget trim (never written)---> gone (its name remembered: a later
                                                              miss on it counts as `evicted`)

    load with a store: every file's header is read (index) -> DISK blocks, rows not mapped yet.

Which models pool (`poolable`): those whose every cached layer keeps every position. A
sliding-window layer keeps a ring (the rows of a prefix are overwritten as the sequence goes on)
and a recurrent layer keeps one state per slot with a few checkpoints, not per-position rows;
both would need whole-slot snapshots rather than blocks, so gemma's local layers and qwen35 keep
only their slots' prefixes (engine.batch's slot reuse), as before.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..kv import KVCache
from ..prompt import PositionKey, common_prefix
from .blocks import BLOCK, Block, chain_hash
from .disk import DiskStore, StoreError

log = logging.getLogger("modelyard.prompt_cache")

FORGOTTEN = 4096  # names of dropped blocks remembered, to tell an `evicted` miss


def poolable(cache: object) -> str | None:
    """Why a model's cache cannot pool its prefixes (None: it can)."""
    if not isinstance(cache, KVCache):
        return "the model keeps no KV rows"
    if cache.recurrent is not None:
        return "a recurrent family's state is kept per slot (checkpoints), not per position"
    if any(g.is_ring for g in cache.layout.groups):
        return "sliding-window layers keep a ring, not every position"
    return None


@dataclass
class Lookup:
    """What the pool holds of a prompt: `blocks` cover positions [0, n) (the last one perhaps
    only in part); when n falls short of what was asked, `miss` says why (no_entry: nothing
    like it was held; evicted: it was, the budget dropped it; diverged: a held prefix differs
    from position `n` on)."""
    blocks: list[Block] = field(default_factory=list)
    n: int = 0
    miss: str | None = None


class PromptCachePool:
    def __init__(self, cache: KVCache, budget: int, store: DiskStore | None = None,
                 threads: int = 1) -> None:
        why = poolable(cache)
        if why is not None:
            raise ValueError(f"this model cannot pool its prompt cache: {why}")
        self.cache = cache
        self.budget = budget
        self.store = store
        self.threads = max(1, threads)
        self._blocks: dict[bytes, Block] = {}
        self._children: dict[bytes, dict[bytes, Block]] = {}
        self._lru: OrderedDict[bytes, None] = OrderedDict()   # blocks with rows in RAM, oldest first
        self._forgotten: OrderedDict[bytes, None] = OrderedDict()
        self.ram_bytes = 0
        # slots whose rows depend on more than their tokens (a request's own LoRA scales): never
        # saved, the pool's blocks are keyed by tokens alone (the batch runner keeps this set)
        self.foreign: set[int] = set()
        # every layout a block must have: per group (and k, then v) its dtype and row shape
        self._shapes = [(a.dtype, a.shape[1], a.shape[3:]) for a in (*cache.k, *cache.v)]
        if store is not None:
            for block in store.index():
                self._insert(block)

    # -- what the batch runner asks ----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, keys: list[PositionKey], limit: int) -> Lookup:
        """The longest prefix of keys[:limit] the pool holds (rows mapped back from disk if
        need be; a file that fails to read is dropped and the walk stops before it)."""
        found = Lookup()
        parent, pos = b"", 0
        while pos < limit:
            want = tuple(keys[pos:pos + BLOCK])
            block, m = None, 0
            if len(want) == BLOCK:
                b = self._blocks.get(chain_hash(parent, want))
                if b is not None and b.keys == want:
                    block, m = b, BLOCK
            if block is None:  # a tail, or a block that diverges part-way: its common prefix
                for child in self._children.get(parent, {}).values():
                    n = common_prefix(list(child.keys), list(want))
                    if n > m:
                        block, m = child, n
            if block is None or not self._hold(block):
                found.miss = self._why_missing(parent, want)
                break
            found.blocks.append(block)
            pos += m
            parent = block.name
            if m < BLOCK:
                found.miss = "diverged" if m < len(want) else None
                break
        found.n = min(pos, limit)
        if found.n >= limit:
            found.miss = None
        for block in reversed(found.blocks):  # ancestors end up the most recently used
            self._touch(block)
        return found

    def restore(self, slot: int, found: Lookup) -> None:
        """Put the found prefix in `slot` (its rows copied; the slot holds [0, found.n)).

        The copy runs on `threads` threads, each over its own share of the layers: what it costs
        is mostly first touches of the slot's pages (a freshly loaded model's KV memory, slow on
        a VM whose host takes freed pages back), and those scale with threads (6,000 SmolLM2
        positions, 141 MB: 610-800 ms on one thread, 360-470 ms on two; on two threads in a new
        process anywhere from 0.04 to 1.04 s, as the host hands out pages)."""
        spans, pos = [], 0
        for block in found.blocks:
            m = min(len(block.keys), found.n - pos)
            if m <= 0:
                break
            assert block.k is not None and block.v is not None
            spans.append((pos, m, block.k, block.v))
            pos += m
        n_layers = min((a.shape[1] for a in self.cache.k), default=0)
        parts = max(1, min(self.threads, n_layers)) if pos >= 2 * BLOCK else 1  # short: one thread

        def copy(part: int) -> None:  # this part's share of every group's layers
            for g, (ck, cv) in enumerate(zip(self.cache.k, self.cache.v)):
                n = ck.shape[1]
                layers = slice(n * part // parts, n * (part + 1) // parts)
                for p0, m, k, v in spans:
                    ck[slot, layers, p0:p0 + m] = k[g][layers, :m]
                    cv[slot, layers, p0:p0 + m] = v[g][layers, :m]

        if parts == 1:
            copy(0)
        else:
            with ThreadPoolExecutor(parts - 1) as ex:
                others = [ex.submit(copy, i) for i in range(1, parts)]
                copy(0)
                for f in others:
                    f.result()
        self.cache.tokens[slot] = [k for b in found.blocks for k in b.keys][:found.n]
        self.cache.written[slot] = found.n
        self.trim()

    def take(self, slot: int, keys: list[PositionKey], limit: int, reuse: int,
             resume_point: object = None) -> tuple[int, Lookup]:
        """At admission: the slot chosen for keys can continue from `reuse`; if the pool holds
        more, the slot's own content goes into the pool and the pool's prefix into the slot.
        Returns the new reuse and the lookup (its miss says why it ended where it did)."""
        found = self.lookup(keys, limit)
        if callable(resume_point):  # an image span whose rows are evaluated whole
            found.n = min(found.n, int(resume_point(found.n)))
        if found.n > reuse:
            self.save(slot, trim=False)  # a trim now could drop the blocks about to be copied
            self.restore(slot, found)    # (it trims after the copy)
            return found.n, found
        if len(self.cache.tokens[slot]) > reuse:
            self.save(slot)  # its tail beyond what this prompt shares is about to be overwritten
        if reuse > found.n:  # the slot held more than the pool: where it stopped matching
            found.n, found.miss = reuse, "diverged" if reuse < limit else None
        return reuse, found

    def save(self, slot: int, n: int | None = None, trim: bool = True) -> int:
        """Put the slot's first n positions (default: all it holds) into the pool; blocks
        already held are only touched. Returns the bytes added."""
        if slot in self.foreign:
            return 0
        held = self.cache.tokens[slot]
        n = len(held) if n is None else min(n, len(held))
        added, parent, chain = 0, b"", []
        for p0 in range(0, n, BLOCK):
            keys = tuple(held[p0:min(p0 + BLOCK, n)])
            name = chain_hash(parent, keys)
            block = self._blocks.get(name)
            if block is None or block.keys != keys:
                if not self._covered(parent, keys):
                    block = self._copy(slot, p0, keys, parent, name)
                    self._insert(block)
                    added += block.nbytes
                else:
                    break
            chain.append(block)
            parent = name
        for block in reversed(chain):
            if block.in_ram:
                self._touch(block)
        if trim:
            self.trim()
        return added

    def trim(self, budget: int | None = None) -> int:
        """Drop least recently used rows until the pool holds at most `budget` bytes (default:
        its own). A block on disk keeps its file. Returns the bytes freed."""
        limit = self.budget if budget is None else budget
        freed = 0
        while self.ram_bytes > limit and self._lru:
            name, _ = self._lru.popitem(last=False)
            block = self._blocks[name]
            freed += self._unhold(block)
            if block.path is None:
                self._remove(block)
        return freed

    def spill(self) -> int:
        """Write the blocks not yet on disk, most recently used first (the model is closing:
        no other thread uses the pool). Returns the blocks written."""
        if self.store is None:
            return 0
        written = 0
        for name in reversed(self._lru):
            block = self._blocks[name]
            if block.path is not None or block.k is None or block.v is None:
                continue
            try:
                block.path = self.store.write(block)
            except StoreError as exc:
                log.warning("prompt cache: %s", exc)
                break
            written += 1
        self.store.trim()
        return written

    def close(self) -> None:
        """The slots' content and the pool's blocks to disk (a store: else nothing kept)."""
        if self.store is None:
            return
        for slot in range(len(self.cache.tokens)):
            self.save(slot)
        self.spill()

    # -- the tree ----------------------------------------------------------------------------

    def _covered(self, parent: bytes, keys: tuple[PositionKey, ...]) -> bool:
        """A held child of `parent` starts with all of `keys` (a shorter tail adds nothing)."""
        return any(child.keys[:len(keys)] == keys for child in self._children.get(parent, {}).values())

    def _copy(self, slot: int, p0: int, keys: tuple[PositionKey, ...], parent: bytes,
              name: bytes) -> Block:
        p1 = p0 + len(keys)
        k = [np.array(a[slot, :, p0:p1]) for a in self.cache.k]
        v = [np.array(a[slot, :, p0:p1]) for a in self.cache.v]
        return Block(name, parent, keys, k, v, sum(a.nbytes for a in (*k, *v)))

    def _insert(self, block: Block) -> None:
        siblings = self._children.setdefault(block.parent, {})
        for other in list(siblings.values()):  # a tail this block extends is replaced
            if not other.full and block.keys[:len(other.keys)] == other.keys and other is not block:
                self._remove(other)
        self._blocks[block.name] = block
        siblings[block.name] = block
        if block.in_ram:
            self._lru[block.name] = None
            self.ram_bytes += block.nbytes

    def _remove(self, block: Block) -> None:
        """Forget a block and everything under it (unreachable without it); files stay for the
        disk store's own LRU unless they are tails replaced here."""
        for child in list(self._children.get(block.name, {}).values()):
            self._remove(child)
        self._children.pop(block.name, None)
        self._unhold(block)
        self._lru.pop(block.name, None)
        self._blocks.pop(block.name, None)
        self._children.get(block.parent, {}).pop(block.name, None)
        self._forgotten[block.name] = None
        if len(self._forgotten) > FORGOTTEN:
            self._forgotten.popitem(last=False)

    def _touch(self, block: Block) -> None:
        if block.in_ram:
            self._lru[block.name] = None
            self._lru.move_to_end(block.name)

    def _hold(self, block: Block) -> bool:
        """Rows in RAM: mapped back from its file if need be. False (and the block dropped)
        when the file cannot be read."""
        if block.in_ram:
            return True
        assert self.store is not None and block.path is not None
        try:
            k, v = self.store.read(block, self._shapes)
        except StoreError as exc:
            log.warning("prompt cache: %s; ignored", exc)
            self._remove(block)
            return False
        block.k, block.v, block.mapped = k, v, True
        self._lru[block.name] = None
        self.ram_bytes += block.nbytes
        return True

    def _unhold(self, block: Block) -> int:
        if not block.in_ram:
            return 0
        block.k = block.v = None
        block.mapped = False
        self.ram_bytes -= block.nbytes
        return block.nbytes

    def _why_missing(self, parent: bytes, want: tuple[PositionKey, ...]) -> str:
        if len(want) == BLOCK and chain_hash(parent, want) in self._forgotten:
            return "evicted"
        return "diverged" if parent else "no_entry"  # a held prefix, then something else
