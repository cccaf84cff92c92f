"""Gemma 3 270M batched like SmolLM2 (tests/engine/test_batching.py): a sequence's tokens do not
depend on its company in the batch, also past the ring of its sliding-window layers (n_ctx 2048,
ring 1023 rows); the independent expectation is the engine's one-sequence path (Model.stream).
tests/gateway/test_serve_gemma3.py serves it beside SmolLM2.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import engine
from engine.batch import BatchRunner, Sequence
from engine.sampling import SamplingParams
from tests.support.batch_checks import COMPLETION_PROMPTS as PROMPTS
from tests.support.batch_checks import alone, assert_same_or_near_tie, run_all

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(temperature=0.0)
N_NEW = 20


@pytest.fixture(scope="module")
def gemma(gemma3_path: Path):
    model = engine.load(gemma3_path, n_ctx=2048, n_threads=2, n_slots=6)
    yield model
    model.close()


def prompt_ids(model: Any, text: str) -> list[int]:
    return [model.tokenizer.bos_id, *model.tokenizer.encode(text)]


def test_greedy_tokens_do_not_depend_on_the_batch(gemma):
    prompts = [prompt_ids(gemma, t) for t in PROMPTS]
    expected = [alone(gemma, ids, GREEDY, N_NEW) for ids in prompts]
    runner = BatchRunner(gemma, prefill_budget=24)
    seqs = [Sequence(ids, params=GREEDY, max_tokens=N_NEW, stop_at_eog=False) for ids in prompts]
    for seq in seqs[:2]:
        runner.submit(seq)
    sizes = []
    for i in range(1000):
        if i == 2:
            for seq in seqs[2:]:
                runner.submit(seq)
        if not runner.busy:
            break
        sizes.append(runner.step().n_sequences)
    runner.close()
    assert max(sizes) == 6
    for ids, want, seq in zip(prompts, expected, seqs):
        assert_same_or_near_tie(gemma, ids, want, seq.generated)


def test_seeded_sampling_is_reproducible_per_request(gemma):
    prompts = [prompt_ids(gemma, t) for t in PROMPTS]
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=7 + i) for i in range(6)]
    expected = [alone(gemma, ids, p, N_NEW) for ids, p in zip(prompts, params)]
    runner = BatchRunner(gemma)
    seqs = [Sequence(ids, params=p, max_tokens=N_NEW, stop_at_eog=False)
            for ids, p in zip(prompts, params)]
    for seq in reversed(seqs):
        runner.submit(seq)
    run_all(runner)
    runner.close()
    assert [s.generated for s in seqs] == expected


def test_a_batch_past_the_ring_gives_the_tokens_of_a_lone_sequence(gemma):
    """A prompt longer than the local layers' ring (1023 rows), read in budgeted chunks beside a
    short one, and a second request sharing its prefix (copy_prefix of a wrapped ring)."""
    words = ("The river valley has a long history, full of small stories about farmers, "
             "travellers and the weather. ")
    long_ids = prompt_ids(gemma, words * 80)[:1300]
    assert len(long_ids) == 1300 and gemma.transformer.cache.layout.groups[1].ring == 1023
    want = alone(gemma, long_ids, GREEDY, 12)
    runner = BatchRunner(gemma, prefill_budget=128)
    seqs = [Sequence(long_ids, params=GREEDY, max_tokens=12, stop_at_eog=False),
            Sequence(prompt_ids(gemma, PROMPTS[0]), params=GREEDY, max_tokens=12, stop_at_eog=False),
            Sequence(long_ids, params=GREEDY, max_tokens=12, stop_at_eog=False)]
    for seq in seqs:
        runner.submit(seq)
    run_all(runner)
    runner.close()
    assert seqs[0].generated == want and seqs[2].generated == want
    assert seqs[2].cached == len(long_ids) - 1  # the copy took the whole prompt but one token
