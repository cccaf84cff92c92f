"""The merge loops against plain restatements of their definitions, and their cost by counting.

The naive mergers below rescan every pair after each merge (quadratic, obviously right); the heap
versions must give the same symbols on random strings over small alphabets, where ties, overlaps
("aaa") and stale queue entries are common. Cost is checked without a clock: every pop is one
O(log n) heap operation, and the pops must stay within 3n for any string shape.
"""
from __future__ import annotations

import itertools
import random

import pytest

from engine.tokenizer.merge import bpe_merge, spm_merge

RANKS = {pair: r for r, pair in enumerate([
    ("a", "b"), ("b", "c"), ("ab", "c"), ("c", "c"), ("a", "a"), ("aa", "a"), (" ", "a"),
    (" a", "b"), ("b", "b"), ("aa", "aa"), ("abc", "abc"), ("bb", "a"), ("c", "a"), ("ca", "b"),
    ("aaaa", "aaaa"), ("b", " "), ("cc", "cc")])}

VOCAB = ["a", "b", "c", "▁", "ab", "bc", "abc", "aa", "aaa", "aaaa", "▁a", "▁ab", "cc", "ccc",
         "ba", "bab", "aab", "ca", "cab", "▁▁", "aaaaaaaa", "b▁", "abab"]
SCORES = [-float(i % 7) for i in range(len(VOCAB))]   # many ties on purpose
ID_OF = {t: i for i, t in enumerate(VOCAB)}


def naive_bpe(parts: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    parts = list(parts)
    while True:
        found = [(ranks[p], i) for i, p in enumerate(itertools.pairwise(parts)) if p in ranks]
        if not found:
            return parts
        _, i = min(found)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def naive_spm(text: str, id_of: dict[str, int], scores: list[float]) -> list[str]:
    parts = list(text)
    while True:
        found = [(-scores[id_of[a + b]], i) for i, (a, b) in enumerate(itertools.pairwise(parts))
                 if a + b in id_of]
        if not found:
            return parts
        _, i = min(found)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


@pytest.mark.parametrize("alphabet", ["ab", "abc", "abc ", "a"])
def test_bpe_merge_equals_the_naive_merger_on_random_strings(alphabet: str) -> None:
    rng = random.Random(alphabet)
    for _ in range(400):
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert bpe_merge(list(word), RANKS)[0] == naive_bpe(list(word), RANKS), word


@pytest.mark.parametrize("alphabet", ["ab", "abc", "abc▁", "a", "ab▁x"])
def test_spm_merge_equals_the_naive_merger_on_random_strings(alphabet: str) -> None:
    rng = random.Random(alphabet)
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert spm_merge(text, ID_OF, SCORES)[0] == naive_spm(text, ID_OF, SCORES), text


def _shapes(n: int) -> dict[str, str]:
    rng = random.Random(n)
    return {"one character": "a" * n, "two alternating": "ab" * (n // 2),
            "random abc": "".join(rng.choice("abc") for _ in range(n)),
            "runs": "".join(rng.choice("abc") * rng.randint(1, 30) for _ in range(n))[:n]}


@pytest.mark.parametrize("n", [1_000, 16_000, 64_000])
def test_merge_work_is_linear_in_heap_operations_for_every_shape(n: int) -> None:
    for name, text in _shapes(n).items():
        _, pops = bpe_merge(list(text), RANKS)
        assert pops <= 3 * len(text), (name, pops)
        _, pops = spm_merge(text.replace(" ", "▁"), ID_OF, SCORES)
        assert pops <= 3 * len(text), (name, pops)


def test_a_run_of_one_character_merges_as_derived_by_hand() -> None:
    # "a a" (rank 4) merges left first: aa a a a -> aa aa a; then "aa a" (5) beats "aa aa" (9)
    assert bpe_merge(list("aaaaa"), RANKS)[0] == ["aa", "aaa"]
    # nine: aa aa aa aa a; "aa a" (5) at the end before "aa aa" (9): aa aa aa aaa; then leftmost
    # "aa aa": aaaa aa aaa
    assert bpe_merge(list("a" * 9), RANKS)[0] == ["aaaa", "aa", "aaa"]


# -- the compiled loop (engine.kernels.merge) against the same definitions -------------------------
def _interned(texts):
    ids: dict[str, int] = {}
    for t in texts:
        ids.setdefault(t, len(ids))
    return ids


def _bpe_table():
    import numpy as np

    from engine.kernels.merge import PairTable

    ids = _interned(["a", "b", "c", " "] + [x for (a, b) in RANKS for x in (a, b, a + b)])
    rows = np.array([(ids[a], ids[b], r, ids[a + b]) for (a, b), r in RANKS.items()]).T
    return ids, PairTable(*rows)


def _spm_table():
    """SPM as pairs: every split of a token into two symbols (tokens or single characters),
    prioritised by the token's score rank (equal scores share a priority: ties are leftmost)."""
    import numpy as np

    from engine.kernels.merge import PairTable

    ids = _interned(VOCAB + list("abc▁x"))
    order = {s: r for r, s in enumerate(sorted(set(SCORES), reverse=True))}
    rows = [(ids[t[:k]], ids[t[k:]], order[SCORES[ID_OF[t]]], ids[t]) for t in VOCAB
            for k in range(1, len(t)) if t[:k] in ids and t[k:] in ids]
    return ids, PairTable(*np.array(rows).T)


@pytest.mark.parametrize("alphabet", ["ab", "abc", "abc ", "a"])
def test_compiled_bpe_merge_equals_the_naive_merger(alphabet: str) -> None:
    from engine.kernels.merge import merge

    ids, table = _bpe_table()
    text_of = {v: k for k, v in ids.items()}
    rng = random.Random(alphabet)
    for _ in range(400):
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        out, _ = merge([ids[c] for c in word], table)
        assert [text_of[i] for i in out] == naive_bpe(list(word), RANKS), word


@pytest.mark.parametrize("alphabet", ["ab", "abc", "abc▁", "a", "ab▁x"])
def test_compiled_merge_with_tied_priorities_equals_the_naive_spm(alphabet: str) -> None:
    from engine.kernels.merge import merge

    ids, table = _spm_table()
    text_of = {v: k for k, v in ids.items()}
    rng = random.Random(alphabet)
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        out, _ = merge([ids[c] for c in text], table)
        assert [text_of[i] for i in out] == naive_spm(text, ID_OF, SCORES), text


def test_compiled_merge_work_is_linear_in_heap_operations_for_every_shape() -> None:
    from engine.kernels.merge import merge

    ids, table = _bpe_table()
    for name, text in _shapes(64_000).items():
        out, pops = merge([ids[c] for c in text], table)
        assert pops <= 3 * len(text), (name, pops)
        assert len(out) >= 1


def _compiled_spm_pieces(text: str) -> list[str]:
    from engine.kernels.merge_spm import SpmVocab
    from engine.kernels.merge_spm import spm_merge as compiled

    symbols, _ = compiled(text, SpmVocab(VOCAB, SCORES))
    starts = [s for _, s in symbols] + [len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(starts)]
    # a symbol's id is its token's, or -1 for a lone character no token covers
    assert [t for t, _ in symbols] == [ID_OF.get(p, -1) for p in pieces]
    return pieces


@pytest.mark.parametrize("alphabet", ["ab", "abc", "abc▁", "a", "ab▁x", "aé日▁"])
def test_compiled_spm_merge_equals_the_naive_merger(alphabet: str) -> None:
    rng = random.Random(alphabet)
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert _compiled_spm_pieces(text) == naive_spm(text, ID_OF, SCORES), text


def test_compiled_spm_work_is_linear_in_heap_operations_for_every_shape() -> None:
    from engine.kernels.merge_spm import SpmVocab
    from engine.kernels.merge_spm import spm_merge as compiled

    vocab = SpmVocab(VOCAB, SCORES)
    for name, text in _shapes(64_000).items():
        _, pops = compiled(text.replace(" ", "▁"), vocab)
        assert pops <= 3 * len(text), (name, pops)
