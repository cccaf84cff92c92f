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


def bpe_merge(parts: Sequence[str], ranks: Mapping[tuple[str, str], int]) -> tuple[list[str], int]:
    """Merge `parts` (one byte symbol each) by `ranks`; returns (merged parts, heap pops)."""
    sym = list(parts)                    # symbol text; "" once merged into its left neighbour
    n = len(sym)
    if n < 2:
        return sym, 0
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
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
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
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
        neg_score, left, joined = pop(heap)
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
