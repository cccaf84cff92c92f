"""A small model drafting for a bigger one of the same vocabulary (speculative decoding).

`DraftModel` holds the small model and lends its KV-cache slots, one per drafting sequence
(`drafter()`; a sequence that finds none left decodes without drafts). A `ModelDrafter` keeps
its slot in step with the sequence: each `propose` truncates the slot to what it shares with the
context (the target's rejections and the draft's own unaccepted guesses go), reads what is new,
then decodes greedily, one token a forward, until n tokens or until its top probability falls
below `p_min` (a guess it doubts costs the target a row for little chance of a hit).

    slot: free --drafter()--> lent to one sequence --close() (the sequence ended)--> free
"""
from __future__ import annotations

import os

import numpy as np

from .gguf import read_header
from .kv import MAX_CHUNK, RollbackError
from .model import Chunk, Transformer
from .prompt import PositionKey, common_prefix


def why_not_a_draft(draft: str | os.PathLike[str], target: str | os.PathLike[str]) -> str | None:
    """Why the GGUF `draft` cannot draft for `target` (from both headers), or None."""
    d, _ = read_header(draft)
    t, _ = read_header(target)
    return same_vocabulary(list(d.get("tokenizer.ggml.tokens") or []),
                           list(t.get("tokenizer.ggml.tokens") or []))


def same_vocabulary(draft_tokens: list[str], target_tokens: list[str]) -> str | None:
    """Why a draft with `draft_tokens` cannot draft for `target_tokens` (their
    tokenizer.ggml.tokens), or None: the same tokens, in the same order."""
    if len(draft_tokens) != len(target_tokens):
        return (f"its vocabulary has {len(draft_tokens)} tokens, the model's "
                f"{len(target_tokens)}")
    bad = next((i for i, (a, b) in enumerate(zip(draft_tokens, target_tokens)) if a != b), None)
    if bad is not None:
        return (f"token {bad} is {draft_tokens[bad]!r} in it, {target_tokens[bad]!r} in the "
                "model")
    return None


class DraftModel:
    """The small model's transformer and its free slots."""

    def __init__(self, transformer: Transformer, n_slots: int, n_ctx: int,
                 p_min: float = 0.0) -> None:
        self.transformer = transformer
        self.n_ctx = n_ctx
        self.p_min = p_min
        self._free = list(range(n_slots))

    def drafter(self, n_draft: int) -> ModelDrafter | None:
        if not self._free:
            return None
        return ModelDrafter(self, self._free.pop(), n_draft)

    def give_back(self, slot: int) -> None:
        self._free.append(slot)


class ModelDrafter:
    def __init__(self, owner: DraftModel, slot: int, n_draft: int) -> None:
        self.owner, self.slot, self.n_draft = owner, slot, n_draft
        self._closed = False

    def propose(self, context: list[int], n: int) -> list[int]:
        owner = self.owner
        n = min(n, self.n_draft, owner.n_ctx - len(context))
        if n < 1 or self._closed:
            return []
        tr = owner.transformer
        cache = tr.cache
        keys: list[PositionKey] = list(context)
        keep = min(common_prefix(cache.tokens[self.slot], keys), len(context) - 1)
        try:
            cache.truncate(self.slot, keep)
        except RollbackError:  # a ring forgot the window before `keep`: read it all again
            keep = 0
            cache.truncate(self.slot, 0)
        logits = np.empty(0, np.float32)
        for a in range(keep, len(context), MAX_CHUNK):
            b = min(a + MAX_CHUNK, len(context))
            logits = tr.forward([Chunk(self.slot, context[a:b], a, logits=int(b == len(context)))],
                                "last")[0]                               # [n_vocab]
        out: list[int] = []
        pos = len(context)
        while True:
            t = int(np.argmax(logits))
            if owner.p_min > 0.0:
                z = logits.astype(np.float64) - float(logits[t])
                if 1.0 / float(np.exp(z).sum()) < owner.p_min:  # the top token's probability
                    break
            out.append(t)
            if len(out) == n:
                break
            logits = tr.forward([Chunk(self.slot, [t], pos)], "last")[0]
            pos += 1
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.owner.give_back(self.slot)
