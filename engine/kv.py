"""The KV cache and its row arithmetic: where each layer keeps each sequence's keys and values.

Layers fall into cache groups by how far back they look. A full-attention layer keeps every
position of a sequence, `n_ctx` rows per slot. A sliding-window layer (gemma's local layers)
sees only the last `window` positions, so it keeps a ring: the key at position p lives in row
p % ring. The ring is longer than the window by one chunk (ring = window + MAX_CHUNK - 1, as
llama.cpp sizes its SWA cache n_swa + n_ubatch): a chunk writes all its keys before its queries
attend, and the chunk's last key must not overwrite one its first query still sees. Its first
`mirror` rows are mirrored past its end (a key with p % ring < mirror is written twice), so any
query's keys lie in consecutive rows and attention reads them like a full cache, without a wrap
test per key (that test cost a third of the attention kernels' time). A causal query reads at
most a window, so mirror = window - 1; where a load takes bidirectional spans (gemma3 fed
images) a query inside a span also reads the span's later keys, up to a chunk's worth ahead, so
there the mirror is ring - 1 (a window and a whole chunk fit). So Gemma 3 270M at n_ctx 32768 keeps
1023 + 511 rows per slot (1023 + 1022 when fed images) in its 15 local layers and 32768 in its 3
global ones. Layers of another head dim or KV head count are a group of their own (gemma4's
full layers), and a
layer that reads an earlier layer's cache (HParams.kv_layer: gemma4's shared KV) keeps none:
`where` sends it to its source's rows, and the memory estimate counts only the sources.

    group g:  k[g], v[g]  f16 [slot, layer of the group, rows, n_kv_head, head_dim]
              (a quantized type_k / type_v: uint8 [..., n_kv_head, row_bytes(head_dim)] of
              ggml blocks, engine.kv_types)
    token at position p of slot s  ->  row  s * n_layers(g) * rows(g) + p % ring(g)
                                       (counted from that layer's first row, k[g][0, layer]),
                                       and + ring(g) too when p % ring(g) < mirror(g)

KVLayout owns this arithmetic (the forward pass, its tasks and the attention kernel all follow
it); KVCache owns the arrays and what each slot holds: per position a key (engine.prompt: a
token's id, an embedding row's (span key, index)), which prefix reuse compares.

A ring forgets: a slot whose ring has seen positions up to `written` (its high-water mark,
which truncating the slot does not lower: the rows stay overwritten; only going back to 0,
where no old row is read again, resets it) can resume at position n only while the ring still
has the window before n (`resumable`); prefix reuse, copy_prefix and truncate ask first. The
ring row of position p is overwritten by p + ring, so a slot written up to W can roll back to
any n >= W - (ring - window + 1) = W - MAX_CHUNK (the ring's spare rows and one), more than a
draft's rollback needs; further back only to 0 (re-reading the prompt), and `truncate` says so
by raising.

A recurrent family's stateful layers (qwen35's Gated DeltaNet: ArchSpec.recurrent) keep no rows
here: KVCache holds their per-slot state and its checkpoints (engine.recurrent) beside the rows
of the attention layers, and asks it too when a slot is reused, truncated or copied: such a slot
goes back only to a checkpoint, its end or 0 (RecurrentRollbackError otherwise).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hparams import HParams
from .kv_types import F16, KVType
from .prompt import PositionKey
from .recurrent import RecurrentShape, RecurrentState

# Most tokens one chunk of a forward call may hold when a model has ring layers (api's prefill
# chunk; the batch runner's per-step budget is below it).
MAX_CHUNK = 512


@dataclass(frozen=True)
class CacheGroup:
    layers: tuple[int, ...]   # the model layers in this group, in order
    ring: int                 # positions wrap at this many rows: n_ctx, or a ring
    window: int               # keys a query sees, itself included (0: every earlier one)
    is_ring: bool             # ring < n_ctx: positions wrap, old ones are overwritten
    mirror: int = 0           # a ring's first rows stored again past its end (0: not a ring)
    head_dim: int = 0         # its layers' head dim (gemma4's sliding and full layers differ)
    n_head_kv: int = 0        # and KV heads

    @property
    def rows(self) -> int:
        """Rows stored per slot and layer: a ring's mirror included."""
        return self.ring + self.mirror


class KVLayout:
    """Cache groups of a model at a context size, and the per-call row tables (STEP)."""

    def __init__(self, hp: HParams, n_ctx: int, bidirectional: bool = False) -> None:
        """`bidirectional`: the load takes bidirectional spans (a family that attends so, fed
        images), whose rings mirror ring - 1 rows."""
        self.n_ctx = n_ctx
        self.kv_dim = hp.kv_dim
        self.recurrent: RecurrentShape | None = (
            hp.spec.recurrent(hp) if hp.spec.recurrent is not None else None)
        stateful = set(self.recurrent.layers) if self.recurrent is not None else set()
        by_kind: dict[tuple[int, int, int], list[int]] = {}
        for li in range(hp.n_layer):
            # a layer sharing an earlier one's cache keeps none; a recurrent layer keeps a
            # state, not rows (engine.recurrent)
            if hp.has_kv(li) and li not in stateful:
                kind = (hp.layer_window(li), hp.layer_head_dim(li), hp.layer_n_head_kv(li))
                by_kind.setdefault(kind, []).append(li)
        groups = []
        for (window, head_dim, n_head_kv), layers in sorted(by_kind.items()):
            ring = n_ctx if window == 0 else min(n_ctx, window + MAX_CHUNK - 1)
            # a causal query reads a window; a bidirectional one up to a chunk further
            mirror = 0 if ring == n_ctx else ring - 1 if bidirectional else window - 1
            groups.append(CacheGroup(tuple(layers), ring, window, ring < n_ctx, mirror, head_dim,
                                     n_head_kv))
        self.groups: tuple[CacheGroup, ...] = tuple(groups)
        own = {li: (g, i) for g, grp in enumerate(self.groups) for i, li in enumerate(grp.layers)}
        self.where: dict[int, tuple[int, int]] = {  # layer -> (group, index in the group): a
            li: own[hp.kv_layer(li)] for li in range(hp.n_layer)  # sharer's is its source's;
            if hp.kv_layer(li) in own}  # a recurrent layer has none

    def bytes_per_slot(self, type_k: KVType = F16, type_v: KVType = F16) -> int:
        """Keys + values of one slot over the layers that keep their own (q8_0 rows take 34
        bytes per 32 values against f16's 64), and a recurrent family's states (the live one
        and its checkpoints: engine.recurrent)."""
        states = 0 if self.recurrent is None else RecurrentState.bytes_per_slot(self.recurrent)
        return sum(len(g.layers) * g.rows * g.n_head_kv
                   * (type_k.row_bytes(g.head_dim) + type_v.row_bytes(g.head_dim))
                   for g in self.groups) + states

    def max_chunk(self) -> int:
        """Most tokens one chunk may hold (a ring must keep its first query's window)."""
        rings = [g.ring - g.window + 1 for g in self.groups if g.is_ring]
        return min(rings) if rings else self.n_ctx

    def earliest_resume(self, written: int) -> int:
        """The first position > 0 a slot whose rings have seen positions [0, written) can
        continue at: a ring keeps only the last `ring` positions written, and position n needs
        the window before it, [n - window + 1, n)."""
        return max([written - g.ring + g.window - 1 for g in self.groups
                    if g.is_ring and written > g.ring], default=0)

    def resumable(self, written: int, n: int) -> bool:
        """Can a slot whose rings have seen positions [0, written) continue at position n?"""
        return n == 0 or n >= self.earliest_resume(written)

    def step_tables(self, slots: list[int], pos0s: list[int], counts: list[int],
                    positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per group, the cache rows of every token and every chunk's row of the chunk table:
        (kv_rows int64 [n_groups, T], mirror_rows int64 [n_groups, T]: a ring's second row of
        the token, else -1, chunks int64 [n_groups, C, 4] of (first token row, n_q, pos0, the
        slot's first row)); positions: int64 [T], the chunks' tokens in order."""
        G, C, T = len(self.groups), len(slots), positions.shape[0]
        kv_rows = np.empty((G, T), np.int64)
        mirror = np.full((G, T), -1, np.int64)
        chunks = np.empty((G, C, 4), np.int64)
        first = np.cumsum([0, *counts[:-1]])
        for g, grp in enumerate(self.groups):
            slot_row = np.array(slots, np.int64) * (len(grp.layers) * grp.rows)      # [C]
            in_ring = positions % grp.ring
            kv_rows[g] = np.repeat(slot_row, counts) + in_ring
            if grp.is_ring:
                np.copyto(mirror[g], kv_rows[g] + grp.ring, where=in_ring < grp.mirror)
            chunks[g] = np.stack([first, counts, pos0s, slot_row], axis=1)
        return kv_rows, mirror, chunks


class RollbackError(ValueError):
    """A slot cannot go back to position n: its sliding-window rings overwrote the window
    before it. It can go back to `earliest` or later, or to 0 (and read its prompt again)."""

    def __init__(self, slot: int, n: int, earliest: int) -> None:
        self.slot, self.n, self.earliest = slot, n, earliest
        super().__init__(f"slot {slot} cannot roll back to position {n}: its sliding-window "
                         f"layers have overwritten the window before it (the earliest it can "
                         f"resume at is {earliest}, or 0)")


class RecurrentRollbackError(RollbackError):
    """A recurrent slot has no state at position n: only its checkpoints, its whole length or
    0 can be gone back to (engine.recurrent)."""

    def __init__(self, slot: int, n: int, checkpoints: list[int]) -> None:
        ValueError.__init__(self, f"slot {slot} cannot roll back to position {n}: its recurrent "
                            f"state is kept only at checkpoints {checkpoints}, its end, or 0")
        self.slot, self.n, self.earliest = slot, n, 0


class KVCache:
    """Keys and values for `n_slots` independent sequences, laid out by a KVLayout: f16, or
    (type_k / type_v quantized, engine.kv_types) uint8 rows of ggml blocks, one row of
    row_bytes(head_dim) per (position, kv head): [slot, layer, rows, kv_head, row_bytes].

    Allocated zeroed, so the kernel hands out pages lazily: memory is committed as it is used.
    `tokens[slot]` is the key of every position the slot holds (engine.prompt.PositionKey: a
    token's id), so a request that continues it can skip the prefix. The cache extends these
    lists in place: replace one by assigning a list of its own, never a Prompt's keys().
    """

    def __init__(self, hp: HParams, n_slots: int, n_ctx: int, bidirectional: bool = False,
                 type_k: KVType = F16, type_v: KVType = F16) -> None:
        self.layout = KVLayout(hp, n_ctx, bidirectional)
        self.type_k, self.type_v = type_k, type_v
        self.k: list[np.ndarray] = []  # per group: [slot, layer of the group, rows, kv_head, head_dim]
        self.v: list[np.ndarray] = []  # (or row_bytes uint8 for a quantized type)
        for g in self.layout.groups:
            for t, arrays in ((type_k, self.k), (type_v, self.v)):
                shape = (n_slots, len(g.layers), g.rows, g.n_head_kv)
                arrays.append(np.zeros((*shape, g.head_dim), np.float16) if not t.quantized
                              else np.zeros((*shape, t.row_bytes(g.head_dim)), np.uint8))
        self.n_ctx = n_ctx
        self.recurrent = (None if self.layout.recurrent is None
                          else RecurrentState(self.layout.recurrent, n_slots))
        self.tokens: list[list[PositionKey]] = [[] for _ in range(n_slots)]
        self.written = [0] * n_slots  # per slot: 1 + the furthest position ever stored

    @property
    def nbytes(self) -> int:
        states = 0 if self.recurrent is None else self.recurrent.nbytes
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v) + states

    def layer(self, li: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(k, v) f16 [slot, rows, kv_head, head_dim] of layer li, and its group's index."""
        g, i = self.layout.where[li]
        return self.k[g][:, i], self.v[g][:, i], g

    def group(self, li: int) -> CacheGroup:
        return self.layout.groups[self.layout.where[li][0]]

    def reusable(self, slot: int, n: int) -> int:
        """n if the slot's first n cached tokens can be continued from, else 0 (a ring forgot);
        a recurrent family's slot: its furthest state at or before n (engine.recurrent)."""
        if self.recurrent is not None:
            return self.recurrent.resume_point(slot, n, len(self.tokens[slot]))
        return n if self.layout.resumable(self.written[slot], n) else 0

    def stored(self, slot: int, keys: list[PositionKey], pos0: int) -> None:
        """Record a forward pass's write: the slot now holds its positions to pos0, then these
        (in place: a decode step appends one key, it does not copy the slot's list)."""
        held = self.tokens[slot]
        del held[pos0:]
        held.extend(keys)
        self.written[slot] = pos0 + len(keys) if pos0 == 0 else max(self.written[slot],
                                                                    pos0 + len(keys))

    def truncate(self, slot: int, n: int) -> None:
        """Roll the slot back to its first n positions (draft tokens rejected, a regeneration):
        the next write goes at n. Raises RollbackError when a ring no longer holds the window
        before n (see the module docstring: back to `written` - MAX_CHUNK or later always works)."""
        held = self.tokens[slot]
        if not 0 <= n <= len(held):
            raise ValueError(f"slot {slot} holds {len(held)} positions; cannot truncate to {n}")
        if not self.layout.resumable(self.written[slot], n):
            raise RollbackError(slot, n, self.layout.earliest_resume(self.written[slot]))
        if self.recurrent is not None and not self.recurrent.restore(slot, n, len(held)):
            raise RecurrentRollbackError(slot, n, self.recurrent.checkpoints(slot))
        del held[n:]
        if n == 0:
            self.written[slot] = 0

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Give slot `dst` the first `n` cached tokens of slot `src` (shared prompts, n > 1).
        A ring is copied whole: it holds src's last positions, the window before n among them."""
        if not self.layout.resumable(self.written[src], n):
            raise ValueError(f"slot {src} no longer holds the window before position {n}")
        if self.recurrent is not None and not self.recurrent.copy(src, dst, n, len(self.tokens[src])):
            raise ValueError(f"slot {src} has no recurrent state at position {n}")
        for g, grp in enumerate(self.layout.groups):
            rows = slice(None) if grp.is_ring else slice(0, n)
            self.k[g][dst, :, rows] = self.k[g][src, :, rows]
            self.v[g][dst, :, rows] = self.v[g][src, :, rows]
        self.tokens[dst] = self.tokens[src][:n]
        self.written[dst] = self.written[src] if any(g.is_ring for g in self.layout.groups) else n
