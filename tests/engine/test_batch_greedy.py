"""engine/batch_greedy.py against its twin, Sampler.sample with temperature 0: the same token for
every row, ties, biases, and the same refusal of non-finite rows."""
from __future__ import annotations

import numpy as np
import pytest

from engine.batch_greedy import greedy_tokens, plain_greedy
from engine.sampling import NonFiniteLogitsError, Sampler, SamplingParams


def twin(row: np.ndarray, bias: dict[int, float]) -> int:
    return Sampler(SamplingParams(temperature=0.0, logprobs=False, logit_bias=bias)).sample(row).token


def test_the_same_tokens_as_the_sampler_with_and_without_bias() -> None:
    rng = np.random.default_rng(7)
    rows, biases = [], []
    for i in range(64):
        row = rng.normal(0, 3, 4096).astype(np.float32)
        if i % 4 == 0:  # ties: the first maximum wins in both
            row[[17, 901, 3000]] = row.max() + 1
        bias: dict[int, float] = {}
        if i % 3 == 0:  # ban the best, force another, and ids outside the vocabulary
            best = int(np.argmax(row))
            bias = {best: -100.0, int(rng.integers(4096)): float(rng.normal(0, 5)), 5000: 100.0,
                    -1: 100.0}
        elif i % 3 == 1:  # a tie made by the bias, in float32 arithmetic
            a, b = int(np.argmax(row)), int(rng.integers(4096))
            bias = {b: float(row[a]) - float(row[b])}
        rows.append(row)
        biases.append(bias)
    kept = [r.copy() for r in rows]
    assert greedy_tokens(rows, biases) == [twin(r, b) for r, b in zip(rows, biases)]
    assert all(np.array_equal(r, k) for r, k in zip(rows, kept))  # the bias went on a copy


def test_rows_of_one_batch_are_views_of_its_logits() -> None:
    logits = np.random.default_rng(1).normal(size=(8, 1000)).astype(np.float32)
    rows = [logits[i] for i in range(8)]
    assert greedy_tokens(rows, [{}] * 8) == [int(np.argmax(r)) for r in rows]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_inf_are_refused_as_by_the_sampler(bad: float) -> None:
    row = np.zeros(100, np.float32)
    row[40] = bad
    with pytest.raises(NonFiniteLogitsError):
        twin(row, {})
    with pytest.raises(NonFiniteLogitsError):
        greedy_tokens([np.ones(100, np.float32), row], [{}, {}])


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
@pytest.mark.parametrize("bias", [{3: float("nan")}, {3: float("inf")}, {3: 1e38, 4: 1e38}])
def test_a_bias_that_makes_the_row_non_finite_is_refused_as_by_the_sampler(bias: dict) -> None:
    row = np.random.default_rng(3).normal(size=100).astype(np.float32) * 1e37
    row[3] = row[4] = 3e38
    with pytest.raises(NonFiniteLogitsError):
        twin(row, bias)
    with pytest.raises(NonFiniteLogitsError):
        greedy_tokens([row], [bias])


def test_a_forced_token_wins_and_a_raw_winner_that_is_banned_loses() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        row = rng.normal(size=300).astype(np.float32)
        best = int(np.argmax(row))
        for bias in ({best: -5.0}, {best: -1e-7}, {best: 0.0}, {int(rng.integers(300)): 2.0},
                     {best: -3.0, int(rng.integers(300)): 0.5}):
            assert greedy_tokens([row], [bias]) == [twin(row, bias)]


def test_a_row_with_nothing_finite_is_refused() -> None:
    row = np.full(10, -np.inf, np.float32)
    with pytest.raises(NonFiniteLogitsError):
        twin(row, {})
    with pytest.raises(NonFiniteLogitsError):
        greedy_tokens([row], [{}])
    # a bias can make a banned-by-model token the only finite one: not if the row is -inf
    with pytest.raises(NonFiniteLogitsError):
        greedy_tokens([row], [{3: 5.0}])


@pytest.mark.parametrize("kwargs, plain", [
    ({"temperature": 0.0, "logprobs": False}, True),
    ({"temperature": 0.0, "logprobs": False, "logit_bias": {1: -100.0}}, True),
    ({"temperature": 0.0, "logprobs": True}, False),
    ({"temperature": 0.0, "logprobs": False, "top_logprobs": 2}, False),
    ({"temperature": 0.0, "logprobs": False, "repeat_penalty": 1.1}, False),
    ({"temperature": 0.0, "logprobs": False, "presence_penalty": 0.5}, False),
    ({"temperature": 0.0, "logprobs": False, "frequency_penalty": 0.5}, False),
    ({"temperature": 0.7, "logprobs": False}, False),
])
def test_only_plain_greedy_takes_the_batch_path(kwargs: dict, plain: bool) -> None:
    assert plain_greedy(SamplingParams(**kwargs)) is plain
