"""Stop strings: generated text is released in order, never any part of a stop string."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class StopScanner(Generic[T]):
    """Releases generated text in order, never any part of a stop string.

    Text that could still turn into a stop string (a suffix that is a prefix of one) is held
    back; a match cuts the text where it starts and ends the generation. Each piece of text
    travels with an item (its token's logprobs), released whole with the piece it came with.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.stopped = False
        self.matched = ""  # the stop string that ended the text
        self._held: list[tuple[str, T]] = []

    def push(self, piece: str, item: T) -> tuple[str, list[T]]:
        """Add one token's text; returns the text and items now safe to release."""
        if self.stopped:
            return "", []
        self._held.append((piece, item))
        if not self.stops:
            return self.flush()
        text = "".join(p for p, _ in self._held)
        hits = [(i, s) for i, s in ((text.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            at, self.matched = min(hits, key=lambda hit: hit[0])
            return self._release(at, cut=True)
        return self._release(len(text) - self._partial_suffix(text), cut=False)

    def flush(self) -> tuple[str, list[T]]:
        """Release everything held (the generation ended for another reason)."""
        text = "".join(p for p, _ in self._held)
        items = [it for _, it in self._held]
        self._held = []
        return text, items

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _release(self, limit: int, cut: bool) -> tuple[str, list[T]]:
        out: list[str] = []
        items: list[T] = []
        start = 0
        while self._held:
            piece, item = self._held[0]
            end = start + len(piece)
            if end <= limit:
                out.append(piece)
                items.append(item)
            elif cut and start < limit:  # the token in which the stop string begins
                out.append(piece[:limit - start])
                items.append(item)
            else:
                break
            self._held.pop(0)
            start = end
        if cut:
            self._held = []
        return "".join(out), items
