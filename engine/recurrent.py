"""Recurrent state per slot (Qwen3.5's Gated DeltaNet layers), and checkpoints of it for reuse.

A recurrent layer keeps no row per position: each sequence carries a state that every token
updates in place, for each such layer
    conv  float32 [d_conv - 1, conv_dim]   the causal conv's last input rows
    ssm   float32 [H_v, S_v, S_k]          the delta rule's matrix per value head
So a slot's state is the state after exactly the positions it holds: it cannot be truncated.
Going back to position n (prefix reuse by a new request, copy_prefix to another slot) needs the
state as it was at n, so a slot keeps checkpoints: copies of every recurrent layer's state at
some positions, taken during the forward pass
    - at every multiple of `every` tokens (decode included), and
    - at the end of every prompt chunk longer than one token (so at the end of each prompt),
      and one token before the end of a chunk that ends a prompt (a request with the same
      prompt, another of n choices, reads only its last token again: it needs its logits),
at most `max_checkpoints` per slot. A request resumes from the longest checkpoint its prompt
matches (or the live state when it matches all the slot holds) and recomputes the rest.
When a slot's checkpoints are all taken, the next one replaces the checkpoint closest to its
predecessor (position 0 counts as one), so they stay spread over the context.

Memory: one state is 4 * n_recurrent_layers * ((d_conv - 1) * conv_dim + H_v * S_v * S_k)
bytes (Qwen3.5-0.8B: 18 layers * (3 * 6144 + 16 * 128 * 128) floats = 20.2 MB), so a slot
holds (1 + max_checkpoints) of them; `bytes_per_slot` counts them all (engine.kv adds it to
the KV cache's share of the memory estimate). The arrays are allocated zeroed, so pages are
committed as checkpoints are written.

Per slot, what a checkpoint entry holds:

    free --save at p (a forward crossing p)--> holds p --truncate below p, reset--> free
                                                  |  ^
                                                  +--+ replaced by a later p' (slots full)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EVERY = 256           # default checkpoint interval in tokens
MAX_CHECKPOINTS = 8   # default checkpoints per slot


@dataclass(frozen=True)
class RecurrentShape:
    """What one recurrent state holds (a family's hyperparameters say)."""
    layers: tuple[int, ...]   # the model layers that are recurrent, in order
    conv_rows: int            # d_conv - 1
    conv_dim: int             # channels of the conv (q, k and v together)
    heads: int                # H_v
    head_v: int               # S_v
    head_k: int               # S_k

    def state_bytes(self) -> int:
        """Bytes of one state of every recurrent layer (the live one or one checkpoint)."""
        return 4 * len(self.layers) * (self.conv_rows * self.conv_dim
                                       + self.heads * self.head_v * self.head_k)


class RecurrentState:
    """Live states and checkpoints of `n_slots` sequences. One caller thread (the model's)."""

    def __init__(self, shape: RecurrentShape, n_slots: int, every: int = EVERY,
                 max_checkpoints: int = MAX_CHECKPOINTS) -> None:
        if every < 1 or max_checkpoints < 0:
            raise ValueError("checkpoint interval must be >= 1 and the count >= 0")
        self.shape, self.every, self.max_checkpoints = shape, every, max_checkpoints
        L, M = len(shape.layers), max_checkpoints
        conv = (L, shape.conv_rows, shape.conv_dim)
        ssm = (L, shape.heads, shape.head_v, shape.head_k)
        self.conv = np.zeros((n_slots, *conv), np.float32)
        self.ssm = np.zeros((n_slots, *ssm), np.float32)
        self.ck_conv = np.zeros((n_slots, M, *conv), np.float32)
        self.ck_ssm = np.zeros((n_slots, M, *ssm), np.float32)
        self.ck_pos = np.full((n_slots, M), -1, np.int64)  # position an entry holds, -1 free
        self.index = {li: i for i, li in enumerate(shape.layers)}

    @staticmethod
    def bytes_per_slot(shape: RecurrentShape, max_checkpoints: int = MAX_CHECKPOINTS) -> int:
        return (1 + max_checkpoints) * shape.state_bytes()

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes + self.ck_conv.nbytes + self.ck_ssm.nbytes

    def checkpoints(self, slot: int) -> list[int]:
        """The positions slot has checkpoints at, ascending."""
        return sorted(int(p) for p in self.ck_pos[slot] if p >= 0)

    def resume_point(self, slot: int, n: int, held: int) -> int:
        """The furthest position <= n the slot can continue from: n itself when it is all the
        slot holds (its live state), else its last checkpoint at or before n, else 0."""
        if n == held:
            return n
        return max((p for p in self.checkpoints(slot) if p <= n), default=0)

    def restore(self, slot: int, n: int, held: int) -> bool:
        """Make the live state the state at n (held: positions the slot holds now) and forget
        checkpoints past n; False (nothing changed) when there is no state for n."""
        if n == held:
            pass
        elif n == 0:
            self.conv[slot] = 0
            self.ssm[slot] = 0
        else:
            entry = self._entry(slot, n)
            if entry < 0:
                return False
            self.conv[slot] = self.ck_conv[slot, entry]
            self.ssm[slot] = self.ck_ssm[slot, entry]
        self.ck_pos[slot][self.ck_pos[slot] > n] = -1
        return True

    def copy(self, src: int, dst: int, n: int, held: int) -> bool:
        """Give dst src's state at n (src holds `held` positions) and src's checkpoints up to
        n; False (nothing changed) when src has no state for n."""
        if n == held:
            conv, ssm = self.conv[src], self.ssm[src]
        else:
            entry = self._entry(src, n)
            if entry < 0:
                return False
            conv, ssm = self.ck_conv[src, entry], self.ck_ssm[src, entry]
        self.conv[dst] = conv
        self.ssm[dst] = ssm
        keep = (self.ck_pos[src] >= 0) & (self.ck_pos[src] <= n)
        self.ck_pos[dst] = np.where(keep, self.ck_pos[src], -1)
        self.ck_conv[dst][keep] = self.ck_conv[src][keep]
        self.ck_ssm[dst][keep] = self.ck_ssm[src][keep]
        return True

    def plan(self, slot: int, pos0: int, n: int, prompt_end: bool) -> list[tuple[int, int]]:
        """The checkpoints a forward pass writing positions [pos0, pos0 + n) of slot takes:
        (tokens into the chunk, entry) for each multiple of `every` in (pos0, pos0 + n], for
        pos0 + n when n > 1 (a prompt chunk's end) and pos0 + n - 1 when the chunk ends a
        prompt (prompt_end: it asks for logits), entries taken now."""
        if not self.max_checkpoints:
            return []
        end = pos0 + n
        at = set(range((pos0 // self.every + 1) * self.every, end + 1, self.every))
        if n > 1:
            at.add(end)
            if prompt_end:
                at.add(end - 1)
        self.ck_pos[slot][self.ck_pos[slot] >= pos0 + 1] = -1  # overwritten positions
        planned: list[tuple[int, int]] = []
        for p in sorted(at)[-self.max_checkpoints:]:
            entry = self._free_entry(slot, [e for _, e in planned])
            self.ck_pos[slot, entry] = p
            planned.append((p - pos0, entry))
        return planned

    def save(self, slot: int, entry: int, layer: int) -> None:
        """Checkpoint entry of slot takes the live state of model layer `layer` now."""
        i = self.index[layer]
        self.ck_conv[slot, entry, i] = self.conv[slot, i]
        self.ck_ssm[slot, entry, i] = self.ssm[slot, i]

    def _entry(self, slot: int, n: int) -> int:
        hits = np.flatnonzero(self.ck_pos[slot] == n)
        return int(hits[0]) if hits.size else -1

    def _free_entry(self, slot: int, taken: list[int]) -> int:
        """A free entry, else the one whose position is closest to the checkpoint before it
        (not one planned in this pass)."""
        pos = self.ck_pos[slot]
        free = [e for e in np.flatnonzero(pos < 0).tolist() if e not in taken]
        if free:
            return int(free[0])
        order = sorted((int(p), e) for e, p in enumerate(pos.tolist()) if e not in taken)
        gaps = [(p - (order[i - 1][0] if i else 0), p, e) for i, (p, e) in enumerate(order)]
        return min(gaps)[2]
