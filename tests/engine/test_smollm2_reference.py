"""SmolLM2-135M-Instruct (Q4_1) against llama.cpp's own outputs in tests/data/smollm2.

Tolerances come from the issue, which takes them from llama.cpp's run-to-run spread (batched versus
token-by-token evaluation moves its logits by up to 1.1-1.6 and flips 1-3% of top-1 tokens).
A top-1 flip is allowed only where llama.cpp's own logits near-tie (its top two within NEAR_TIE),
and at most 5% of rows: the row-interleaved Q4_1 kernel and the blocked prefill attention sum in
another order than llama.cpp and flip 8 of "paragraph"'s 198 rows, every one at a margin under
0.16; their accuracy is held to issue #36's rule instead, as close to the exact float64
evaluation as llama.cpp (tests/engine/test_exact_distance.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import engine
from tests.support.refs import REFS_DIR

pytestmark = pytest.mark.real_model

REFS = REFS_DIR
NEAR_TIE = 0.5  # a greedy split is allowed only where the top two logits are this close


@pytest.fixture(scope="module")
def smol(smollm2_path: Path):
    model = engine.load(smollm2_path, n_ctx=2048, n_threads=2)
    yield model
    model.close()


@pytest.fixture(scope="module")
def greedy() -> dict:
    return json.loads((REFS / "greedy.json").read_text())


@pytest.mark.parametrize("name", ["capital", "paragraph", "code"])
def test_logits_match_llama_cpp(smol, name: str) -> None:
    ref = np.load(REFS / "logits_top32.npz")
    ids = ref[f"{name}_ids"].tolist()
    top_ids, top_logits = ref[f"{name}_top_ids"], ref[f"{name}_top_logits"]  # [T, 32]
    logits = smol.logits(ids)                                                   # [T, n_vocab]
    assert logits.shape == (len(ids), smol.n_vocab)
    ours_top = logits.argmax(-1)
    agree = np.mean(ours_top == top_ids[:, 0])
    for row in np.nonzero(ours_top != top_ids[:, 0])[0]:  # a flip: a near-tie in llama.cpp's too
        where = np.nonzero(top_ids[row] == ours_top[row])[0]
        assert where.size, f"row {row}: our top-1 is not in llama.cpp's top 32"
        margin = float(top_logits[row, 0] - top_logits[row, where[0]])
        assert margin < NEAR_TIE, f"row {row}: top-1 flips at llama.cpp's margin {margin:.2f}"
    ours_at_ref = np.take_along_axis(logits, top_ids, axis=1)
    diff = np.abs(ours_at_ref - top_logits)
    print(f"{name}: top-1 agreement {agree:.3f}, mean |diff| {diff.mean():.3f}, max {diff.max():.3f}")
    assert agree >= 0.95
    assert diff.mean() <= 0.3
    assert diff.max() <= 1.6
    last = ref[f"{name}_last_logits"]
    assert np.abs(logits[-1] - last).mean() <= 0.3


def _check_greedy(smol, prompt_ids: list[int], ref_ids: list[int], must_match: int) -> None:
    ours = list(smol.generate(prompt_ids, max_tokens=len(ref_ids), temperature=0.0,
                              stop_at_eog=False))
    split = next((i for i, (a, b) in enumerate(zip(ours, ref_ids)) if a != b), None)
    if split is None or split >= must_match:
        return
    # A split earlier than `must_match` is allowed only at a near-tie along the reference path.
    logits = smol.logits(prompt_ids + ref_ids[:split])[-1]
    margin = abs(float(logits[ref_ids[split]] - logits[ours[split]]))
    assert margin < NEAR_TIE, (f"greedy output splits from llama.cpp at token {split} "
                               f"(margin {margin:.2f})")


@pytest.mark.parametrize("name", ["capital", "paragraph", "code"])
def test_greedy_continuation_matches_llama_cpp(smol, greedy: dict, name: str) -> None:
    p = greedy["prompts"][name]
    assert smol.tokenizer.encode(p["prompt"]) == p["prompt_ids"]
    _check_greedy(smol, p["prompt_ids"], p["raw_ids"], must_match=32)


def test_chat_reply_matches_llama_cpp(smol, greedy: dict) -> None:
    chat = greedy["chat"]
    _check_greedy(smol, chat["prompt_ids"], chat["raw_ids"], must_match=32)
