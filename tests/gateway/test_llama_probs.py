"""llama-server's post_sampling_probs (gateway/api/llama_probs.py) against a numpy twin of
llama.cpp's sampler chain run over the whole vocabulary (common/sampling.cpp's default order:
top_k, top_p, min_p, temperature, then the softmax `populate_token_probs` reads)."""
from __future__ import annotations

import numpy as np
import pytest

from gateway.api.llama_probs import candidates_needed, post_sampling


def chain_twin(logits: np.ndarray, top_k: int, top_p: float, min_p: float,
               temperature: float) -> dict[int, float]:
    """llama.cpp's chain on every logit: each filter shrinks the candidate set in place."""
    order = np.argsort(-logits, kind="stable")
    cand = order[:top_k] if top_k > 0 else order
    if top_p < 1.0:
        p = np.exp(logits[cand] - logits[cand].max())
        p /= p.sum()
        cut = int(np.searchsorted(np.cumsum(p), top_p) + 1)
        cand = cand[:min(cut, len(cand))]
    if min_p > 0:
        cand = cand[logits[cand] >= logits[cand].max() + np.log(min_p)]
    w = np.exp((logits[cand] - logits[cand].max()) / temperature)
    return {int(t): float(x) for t, x in zip(cand, w / w.sum())}


@pytest.mark.parametrize(("top_k", "top_p", "min_p", "temperature"), [
    (40, 0.95, 0.05, 0.8),   # llama.cpp's defaults
    (40, 0.95, 0.05, 1.0),
    (10, 1.0, 0.0, 1.5),
    (0, 0.5, 0.0, 0.7),      # top_k off: the top POOL candidates suffice for this top_p
    (5, 0.9, 0.2, 1.0),
])
def test_matches_the_chain_over_the_whole_vocabulary(top_k, top_p, min_p, temperature):
    rng = np.random.default_rng(top_k * 7 + int(temperature * 10))
    logits = rng.normal(0, 3, 5000)
    logprobs = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    k = candidates_needed(10, top_k)
    top = [(int(t), float(logprobs[t])) for t in np.argsort(-logprobs)[:k]]
    got = post_sampling(top, top_k=top_k, top_p=top_p, min_p=min_p, temperature=temperature)
    want = chain_twin(logits, top_k, top_p, min_p, temperature)
    assert [t for t, _ in got] == sorted(want, key=lambda t: -want[t])
    assert np.allclose([p for _, p in got], [want[t] for t, _ in got], rtol=1e-9)
    assert sum(p for _, p in got) == pytest.approx(1.0)


def test_greedy_is_the_best_token_with_probability_one():
    assert post_sampling([(3, -0.1), (9, -2.5)], top_k=40, top_p=0.95, min_p=0.05,
                         temperature=0.0) == [(3, 1.0)]
