"""Sampling: each setting against its definition, on small hand-made distributions."""
from __future__ import annotations

import numpy as np
import pytest

from engine.sampling import Sampler, SamplingParams


def draw(params: SamplingParams, logits: np.ndarray, n: int) -> np.ndarray:
    s = Sampler(params)
    out = []
    for _ in range(n):
        out.append(s.sample(logits).token)
        s.generated.clear()  # independent draws from the same distribution
    return np.array(out)


LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], dtype=np.float32)


def softmax(x: np.ndarray, t: float = 1.0) -> np.ndarray:
    e = np.exp((x - x.max()) / t)
    return e / e.sum()


def test_greedy_is_argmax() -> None:
    s = Sampler(SamplingParams(temperature=0.0))
    assert s.sample(LOGITS).token == 0
    assert s.sample(-LOGITS).token == 5


def test_temperature_one_matches_softmax_frequencies() -> None:
    n = 20000
    counts = np.bincount(draw(SamplingParams(temperature=1.0, seed=3), LOGITS, n), minlength=6)
    expected = softmax(LOGITS) * n
    # chi-square with 5 degrees of freedom; 20.5 is the 0.999 quantile
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 20.5


def test_low_temperature_sharpens() -> None:
    n = 4000
    counts = np.bincount(draw(SamplingParams(temperature=0.5, seed=4), LOGITS, n), minlength=6)
    expected = softmax(LOGITS, 0.5) * n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 20.5


def test_same_seed_same_tokens_different_seed_differs() -> None:
    flat = np.zeros(1000, dtype=np.float32)
    a = draw(SamplingParams(temperature=1.0, seed=42), flat, 50)
    b = draw(SamplingParams(temperature=1.0, seed=42), flat, 50)
    c = draw(SamplingParams(temperature=1.0, seed=43), flat, 50)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_a_negative_seed_is_a_seed_too() -> None:
    """OpenAI's seeds are signed; numpy's RNG takes only non-negative ones (the fuzzing run's
    500 on /v1/responses with seed -2): a negative seed is its value modulo 2**64."""
    flat = np.zeros(1000, dtype=np.float32)
    neg = draw(SamplingParams(temperature=1.0, seed=-2), flat, 50)
    assert np.array_equal(neg, draw(SamplingParams(temperature=1.0, seed=2**64 - 2), flat, 50))
    assert not np.array_equal(neg, draw(SamplingParams(temperature=1.0, seed=2), flat, 50))


def test_top_k_keeps_only_k_best() -> None:
    tokens = set(draw(SamplingParams(temperature=5.0, top_k=2, seed=1), LOGITS, 500))
    assert tokens == {0, 1}


def test_top_p_keeps_the_nucleus() -> None:
    p = softmax(LOGITS)
    # smallest prefix whose mass reaches 0.8
    nucleus = int(np.searchsorted(np.cumsum(p), 0.8)) + 1
    tokens = set(draw(SamplingParams(temperature=1.0, top_p=0.8, seed=2), LOGITS, 3000))
    assert tokens == set(range(nucleus))


def test_min_p_drops_unlikely_tokens() -> None:
    p = softmax(LOGITS)
    allowed = {i for i in range(6) if p[i] >= 0.2 * p.max()}
    tokens = set(draw(SamplingParams(temperature=1.0, min_p=0.2, seed=5), LOGITS, 3000))
    assert tokens == allowed


def test_logit_bias_bans_and_forces() -> None:
    banned = draw(SamplingParams(temperature=0.0, logit_bias={0: -100.0}), LOGITS, 1)
    assert banned[0] == 1
    forced = draw(SamplingParams(temperature=1.0, seed=0, logit_bias={5: 100.0}), LOGITS, 50)
    assert set(forced) == {5}


def test_frequency_and_presence_penalties_follow_openai_formula() -> None:
    # token 0 generated twice: logit 2.0 - 2 * 0.6 - 0.5 = 0.3 < 1.0 (token 1) -> greedy picks 1
    s = Sampler(SamplingParams(temperature=0.0, frequency_penalty=0.6, presence_penalty=0.5))
    s.accept(0)
    s.accept(0)
    assert s.sample(LOGITS).token == 1
    # with smaller penalties it stays: 2.0 - 2 * 0.2 - 0.1 = 1.5 > 1.0
    s = Sampler(SamplingParams(temperature=0.0, frequency_penalty=0.2, presence_penalty=0.1))
    s.accept(0)
    s.accept(0)
    assert s.sample(LOGITS).token == 0


def test_repeat_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = np.array([2.0, 1.5, -1.0, -1.2], dtype=np.float32)
    # prompt holds token 0: 2.0 / 2 = 1.0 < 1.5 -> greedy picks 1
    assert Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0), [0]).sample(logits).token == 1
    # negative logits get more negative: -1.0 * 2 = -2.0 < -1.2
    neg = -np.array([5.0, 5.0, 1.0, 1.2], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0, logit_bias={0: -100, 1: -100}),
                [2])
    assert s.sample(neg).token == 3


def test_logprobs_are_the_models_log_softmax() -> None:
    s = Sampler(SamplingParams(temperature=0.7, top_k=3, seed=9, top_logprobs=3))
    out = s.sample(LOGITS)
    ref = np.log(softmax(LOGITS.astype(np.float64)))
    assert out.logprob == pytest.approx(ref[out.token], abs=1e-6)
    assert [t for t, _ in out.top_logprobs] == [0, 1, 2]
    for t, lp in out.top_logprobs:
        assert lp == pytest.approx(ref[t], abs=1e-6)


def test_without_logprobs_the_same_tokens_come_and_no_logprob() -> None:
    """logprobs=False skips the log-softmax only: the draws are the same."""
    for temperature in (0.0, 0.9):
        with_lp = Sampler(SamplingParams(temperature=temperature, seed=3))
        without = Sampler(SamplingParams(temperature=temperature, seed=3, logprobs=False))
        for _ in range(20):
            a, b = with_lp.sample(LOGITS), without.sample(LOGITS)
            assert a.token == b.token and np.isfinite(a.logprob) and np.isnan(b.logprob)


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_p": 0.0}, {"top_p": 1.5},
                                    {"min_p": 2.0}, {"top_k": -1}, {"top_logprobs": -2}])
def test_bad_parameters_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_non_finite_logits_are_an_error_not_a_token() -> None:
    from engine.sampling import NonFiniteLogitsError
    for bad in (np.nan, np.inf):
        logits = LOGITS.copy()
        logits[3] = bad
        for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=1)):
            with pytest.raises(NonFiniteLogitsError):
                Sampler(params).sample(logits)
    # -inf is a legitimate "never": it is simply not chosen
    logits = LOGITS.copy()
    logits[0] = -np.inf
    assert Sampler(SamplingParams(temperature=0.0)).sample(logits).token == 1
