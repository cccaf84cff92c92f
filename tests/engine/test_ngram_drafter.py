"""Prompt lookup's drafter alone (engine/draft.py): what it proposes, and how far it trusts a
match of each n-gram size after what its last draft of that size achieved (the rule in the
module's docstring, checked here step by step on contexts written out by hand)."""
from __future__ import annotations

from engine.draft import NgramConfig, NgramDrafter


def test_proposes_what_followed_the_latest_occurrence_of_the_longest_match():
    d = NgramDrafter(NgramConfig(n_draft=4, ngram_min=1, ngram_max=3))
    # "1 2 3" occurs at 0 (followed by 4 5 6 7) and "2 3" also at 8 (followed by 9)
    ctx = [1, 2, 3, 4, 5, 6, 7, 0, 2, 3, 9, 1, 2, 3]
    assert d.propose(ctx, 8) == [4, 5, 6, 7]          # the 3-gram wins over the later 2-gram
    d2 = NgramDrafter(NgramConfig(n_draft=4, ngram_min=1, ngram_max=3))
    assert d2.propose([5, 2, 3, 9, 8, 2, 3], 8) == [9, 8, 2, 3]  # 2-gram, capped at n_draft
    assert NgramDrafter(NgramConfig()).propose([1, 2, 3], 8) == []  # nothing repeats


def test_a_rejected_draft_shortens_its_sizes_next_drafts_and_full_ones_grow_them():
    d = NgramDrafter(NgramConfig(n_draft=8, ngram_min=1, ngram_max=2))
    body = list(range(100, 120))
    ctx = [*body, 7, *body[:1]]          # last token 100 matches the 1-gram at 0 (not the 2-gram)
    draft = d.propose(ctx, 8)
    assert draft == body[1:9]            # limit 8 at first
    ctx += [55]                          # the target rejected the first drafted token
    assert d.limit[1] == 8               # learnt only when next asked
    d.propose(ctx, 8)
    assert d.limit[1] == 4               # max(0 + 1, 8 // 2)
    # a 1-gram draft again: 55 never occurred before, so make the context end on 101
    ctx += [101]
    draft = d.propose(ctx, 8)
    assert draft == body[2:6]            # four tokens now
    ctx += [*body[2:6], 1]               # all four kept, then the target's own token
    d.propose(ctx, 8)
    assert d.limit[1] == 8               # doubled, at most n_draft
    ctx += [110]
    draft = d.propose(ctx, 8)            # 110 occurred once, followed by 111..
    assert draft == body[11:19]
    ctx += [111, 112, 0]                 # two kept, the third rejected
    d.propose(ctx, 8)
    assert d.limit[1] == 4               # max(2 + 1, 8 // 2)
    assert d.limit[2] == 8               # the other size untouched


def test_the_limit_never_falls_below_one():
    d = NgramDrafter(NgramConfig(n_draft=2, ngram_min=1, ngram_max=1))
    ctx = [4, 5, 6, 4]
    assert d.propose(ctx, 8) == [5, 6]
    ctx += [8, 4]                        # 8 taken instead of 5; then 4 again
    assert d.propose(ctx, 8) == [8]      # limit max(0 + 1, 2 // 2) = 1
    ctx += [7, 4]                        # rejected again
    assert d.propose(ctx, 8) == [7]
    assert d.limit[1] == 1
