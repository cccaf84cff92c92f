"""The two merge loops behind the tokenizers, each O(n log n) in the length of its input.

Both are llama.cpp's: symbols sit in a doubly linked list, candidate pairs in a binary heap keyed
by (priority, left position), and a merge pushes at most the two new pairs it creates. A popped
entry whose pair has changed since it was queued (a side merged away, or the pair now there ranks
differently) is skipped. So with n input symbols there are at most n - 1 + 2 * (n - 1) pushes,
hence at most ~3n pops of O(log n) each, whatever the text looks like (a 64 KiB run of one
character, CJK, a long word without spaces). Each function also returns its pop count, which the
tests hold against that bound: the complexity is checked by counting, not by timing.

  bpe_merge  byte-level BPE: the adjacent pair with the lowest merge rank merges first, leftmost
             on ties. A rank names one pair, so "the pair at this position has the queued rank"
             means the entry is still valid.
  spm_merge  SentencePiece (llama.cpp's SPM): the adjacent pair whose concatenation is a token
             with the highest score merges first, leftmost on ties.
"""
from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence


def _linked(n: int) -> tuple[list[int], list[int]]:
    """The next and previous position of each of n symbols in a row (-1: none)."""
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    return nxt, list(range(-1, n - 1))


def bpe_merge(parts: Sequence[str], ranks: Mapping[tuple[str, str], int]) -> tuple[list[str], int]:
    """Merge `parts` (one byte symbol each) by `ranks`; returns (merged parts, heap pops)."""
    sym = list(parts)                    # symbol text; "" once merged into its left neighbour
    n = len(sym)
    if n < 2:
        return sym, 0
    nxt, prv = _linked(n)
    get = ranks.get
    heap = [(r, i) for i in range(n - 1) if (r := get((sym[i], sym[i + 1]))) is not None]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    pops = 0
    while heap:
        rank, left = pop(heap)
        pops += 1
        right = nxt[left]
        if right < 0 or not sym[left] or get((sym[left], sym[right])) != rank:
            continue  # stale: a side has merged since this pair was queued
        sym[left] += sym[right]
        sym[right] = ""
        after = nxt[left] = nxt[right]
        if after >= 0:
            prv[after] = left
            r = get((sym[left], sym[after]))
            if r is not None:
                push(heap, (r, left))
        before = prv[left]
        if before >= 0:
            r = get((sym[before], sym[left]))
            if r is not None:
                push(heap, (r, before))
    return [s for s in sym if s], pops


def spm_merge(text: str, id_of: Mapping[str, int], scores: Sequence[float]) -> tuple[list[str], int]:
    """Merge the characters of `text` by token score; returns (symbols, heap pops). A symbol is
    a token's text, or a single character that no token covers (the caller falls back to bytes)."""
    sym = list(text)
    n = len(sym)
    if n < 2:
        return sym, 0
    nxt, prv = _linked(n)
    get = id_of.get
    heap: list[tuple[float, int, str]] = []
    for i in range(n - 1):
        joined = sym[i] + sym[i + 1]
        tid = get(joined)
        if tid is not None:
            heap.append((-scores[tid], i, joined))
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    pops = 0
    while heap:
        _, left, joined = pop(heap)
        pops += 1
        right = nxt[left]
        if right < 0 or not sym[left] or sym[left] + sym[right] != joined:
            continue  # stale
        sym[left] = joined
        sym[right] = ""
        after = nxt[left] = nxt[right]
        if after >= 0:
            prv[after] = left
            pair = joined + sym[after]
            tid = get(pair)
            if tid is not None:
                push(heap, (-scores[tid], left, pair))
        before = prv[left]
        if before >= 0:
            pair = sym[before] + joined
            tid = get(pair)
            if tid is not None:
                push(heap, (-scores[tid], before, pair))
    return [s for s in sym if s], pops


class CompiledBpe:
    """bpe_merge for long words, on symbol ids in engine.kernels.merge (same results, tested).

    A symbol's id is its token id, or n_vocab + k for the few texts a merge makes that are not
    tokens (the caller falls back to their characters). Built on first use: ~50k merges take
    ~40 ms, which a model load need not pay.
    """

    def __init__(self, ranks: Mapping[tuple[str, str], int], id_of: Mapping[str, int],
                 n_vocab: int, byte_chars: Sequence[str]) -> None:
        import numpy as np

        from ..kernels.merge import PairTable

        self.n_vocab = n_vocab
        self.extra: list[str] = []         # texts of ids n_vocab, n_vocab + 1, ...
        interned: dict[str, int] = {}

        def sid(text: str) -> int:
            i = id_of.get(text)
            if i is None:
                i = interned.get(text)
                if i is None:
                    i = interned[text] = n_vocab + len(self.extra)
                    self.extra.append(text)
            return i

        rows = [(sid(a), sid(b), r, sid(a + b)) for (a, b), r in ranks.items()]
        cols = np.array(rows, dtype=np.int64).reshape(-1, 4).T
        self.table = PairTable(cols[0], cols[1], cols[2], cols[3])
        self.byte_ids = np.array([sid(c) for c in byte_chars], dtype=np.int32)  # byte -> symbol

    def merge(self, word_bytes: bytes) -> tuple[list[int], int]:
        """Symbol ids after merging the word (its UTF-8 bytes), and the heap pops it took."""
        import numpy as np

        from ..kernels.merge import merge

        ids, pops = merge(self.byte_ids[np.frombuffer(word_bytes, dtype=np.uint8)], self.table)
        return ids.tolist(), pops

    def text(self, symbol: int) -> str:
        return self.extra[symbol - self.n_vocab]
