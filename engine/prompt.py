"""A prompt: a sequence of spans, each of token ids or of embedding rows (an image's, say).

    Prompt  = (TokenSpan | EmbeddingSpan)*        its length is the positions it fills
    TokenSpan      ids          int, one position each
    EmbeddingSpan  rows         float32 [n, n_embd], one position each, and `key`: a hash of
                                what produced them (an image and its projector); `bidirectional`:
                                its rows see each other (Gemma 3's images), so a forward call
                                must hold it whole in one chunk (Prompt.chunk_end)

Semantics are llama.cpp's `llama_batch.embd`: an embedding span's rows take the place of the
token-embedding lookup's rows, BEFORE the family's embedding scale (Gemma multiplies both by
sqrt(n_embd) in its graph). So feeding `dequantize(token_embd[ids])` as an embedding span gives
the logits of the ids themselves, bit for bit.

Prefix matching (the KV cache's prompt reuse, engine.batch) compares per-position keys: a token
position's key is its id; an embedding position's is (span key, row index), unequal to every id
and to every other span's rows, so the same image reuses its cached rows and a different one of
the same size does not. Slicing keeps the keys (a slice's rows know their index in the whole).

A Prompt is immutable; its keys and token ids are computed once, when first asked for.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# A position's identity for prefix matching: a token id, or (embedding span key, row index).
PositionKey = int | tuple[str, int]


@dataclass(frozen=True)
class TokenSpan:
    ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.ids)

    def position_keys(self) -> list[PositionKey]:
        return list(self.ids)

    def part(self, a: int, b: int) -> TokenSpan:
        return TokenSpan(self.ids[a:b])


@dataclass(frozen=True, eq=False)
class EmbeddingSpan:
    """Rows that stand in for token embeddings; `first` is rows[0]'s index in the whole span
    (non-zero only for a slice, so its keys stay those of the rows it holds), `whole` the whole
    span's rows (0: these). bidirectional: the rows attend to each other, not causally (the
    position keys, hence prefix matching, do not change)."""
    rows: np.ndarray   # float32 [n, n_embd], read-only
    key: str
    first: int = 0
    bidirectional: bool = False
    whole: int = 0

    def __post_init__(self) -> None:
        rows = np.ascontiguousarray(self.rows, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] == 0:
            raise ValueError(f"embedding rows must be [n, n_embd], got shape {self.rows.shape}")
        if not np.isfinite(rows).all():
            raise ValueError(f"embedding span {self.key!r} holds non-finite values")
        if not self.key:
            raise ValueError("an embedding span needs a content key")
        if rows is self.rows and rows.flags.writeable:
            rows = rows.view()  # our own read-only view; the caller's array stays writeable
        rows.flags.writeable = False
        object.__setattr__(self, "rows", rows)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def n_embd(self) -> int:
        return int(self.rows.shape[1])

    def position_keys(self) -> list[PositionKey]:
        return [(self.key, self.first + i) for i in range(len(self))]

    @property
    def is_whole(self) -> bool:
        """Not a slice: every row of the span it came from."""
        return self.first == 0 and self.whole in (0, len(self))

    def part(self, a: int, b: int) -> EmbeddingSpan:
        return EmbeddingSpan(self.rows[a:b], self.key, self.first + a, self.bidirectional,
                             self.whole or len(self))


Span = TokenSpan | EmbeddingSpan


class Prompt:
    """An immutable sequence of spans; len() counts positions; prompt[a:b] is a Prompt."""

    __slots__ = ("_ids", "_keys", "_starts", "spans")

    def __init__(self, spans: Iterable[Span] = ()) -> None:
        self.spans: tuple[Span, ...] = tuple(s for s in spans if len(s))
        starts = [0]
        for s in self.spans:
            starts.append(starts[-1] + len(s))
        self._starts = starts                       # [n_spans + 1]: each span's first position
        self._keys: list[PositionKey] | None = None
        self._ids: list[int] | None = None

    @classmethod
    def of_tokens(cls, ids: Iterable[int]) -> Prompt:
        return cls([TokenSpan(tuple(int(t) for t in ids))])

    def __len__(self) -> int:
        return self._starts[-1]

    def __repr__(self) -> str:
        parts = [f"{len(s)} tokens" if isinstance(s, TokenSpan) else f"{len(s)} rows of {s.key!r}"
                 for s in self.spans]
        return f"Prompt({', '.join(parts)})"

    def __add__(self, other: Prompt) -> Prompt:
        return Prompt(self.spans + other.spans)

    def __getitem__(self, index: slice) -> Prompt:
        a, b, step = index.indices(len(self))
        if step != 1:
            raise ValueError("a prompt slices by contiguous positions only")
        if a >= b:
            return Prompt()
        if a == 0 and b == len(self):
            return self
        first = bisect.bisect_right(self._starts, a) - 1
        parts: list[Span] = []
        for i in range(first, len(self.spans)):
            lo = self._starts[i]
            if lo >= b:
                break
            span = self.spans[i]
            parts.append(span.part(max(a - lo, 0), min(b - lo, len(span))))
        out = Prompt(parts)
        if self._keys is not None:  # a chunk of a prompt whose keys are known: no recount
            out._keys = self._keys[a:b]
        return out

    @property
    def has_embeddings(self) -> bool:
        return any(isinstance(s, EmbeddingSpan) for s in self.spans)

    def position_keys(self) -> list[PositionKey]:
        """Per position, its key for prefix matching (shared: do not modify the list)."""
        if self._keys is None:
            if len(self.spans) == 1 and isinstance(self.spans[0], TokenSpan):
                self._keys = list(self.spans[0].ids)
            else:
                self._keys = [k for s in self.spans for k in s.position_keys()]
        return self._keys

    def token_ids(self) -> list[int]:
        """The ids of the token positions, in order (what repetition penalties count)."""
        if self._ids is None:
            self._ids = [t for s in self.spans if isinstance(s, TokenSpan) for t in s.ids]
        return self._ids

    def chunk_end(self, a: int, b: int) -> int:
        """Where a chunk from position a that would end at b ends instead so that it cuts no
        bidirectional span: b, or the start of the span b falls in (if after a), or its end."""
        for start, span in self.embedding_spans():
            if span.bidirectional and start < b < start + len(span):
                return start if start > a else start + len(span)
        return b

    def resume_point(self, n: int) -> int:
        """The furthest position <= n a prefix reuse may stop at: n, or the start of the
        bidirectional span n falls inside (its rows must be evaluated in one chunk, all of them)."""
        for start, span in self.embedding_spans():
            if span.bidirectional and start < n < start + len(span):
                return start
        return n

    def embedding_spans(self) -> list[tuple[int, EmbeddingSpan]]:
        """(first position, span) of every embedding span."""
        return [(self._starts[i], s) for i, s in enumerate(self.spans) if isinstance(s, EmbeddingSpan)]


def common_prefix(a: list[PositionKey], b: list[PositionKey]) -> int:
    """Length of the longest common prefix of two lists of position keys (lists both: a list
    never equals a tuple); slice compares run in C."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def as_prompt(prompt: Prompt | Sequence[int]) -> Prompt:
    """A Prompt as it is, or a plain list of token ids as a one-span Prompt."""
    return prompt if isinstance(prompt, Prompt) else Prompt.of_tokens(prompt)


__all__ = ["EmbeddingSpan", "PositionKey", "Prompt", "Span", "TokenSpan", "as_prompt", "common_prefix"]
