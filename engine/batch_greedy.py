"""Greedy picks for a whole batch: the common serving case in one numpy pass per row, no Sampler
call, no copy of a row without a logit_bias, no separate max.

`Sampler.sample` with temperature 0 copies the row to float32, adds logit_bias, takes the max
(to refuse NaN / +inf), then the argmax: three passes over 49k floats and a few Python calls,
per sequence per step. When a sequence has no grammar mask, no penalties and asks for no
logprobs, the same token comes from one argmax: numpy's argmax returns the first NaN if there is
one, else the first maximum, so the value at the argmax is non-finite exactly when the row's max
is. A logit_bias is applied to its own tokens only: the raw argmax is the best of the others, so
only the biased tokens (in float32, as `Sampler._adjusted` adds them) can beat it; a row is copied
only when the raw winner is itself biased. Sampler.sample is this module's twin:
tests/engine/test_batch_greedy.py compares them bit for bit (ties, biases, NaN, +inf, -inf).
"""
from __future__ import annotations

import numpy as np

from .sampling import NonFiniteLogitsError, SamplingParams


def plain_greedy(params: SamplingParams) -> bool:
    """Whether a sequence's next token is its (biased) logits' argmax and nothing more."""
    return (params.temperature == 0.0 and not params.logprobs and not params.top_logprobs
            and params.repeat_penalty == 1.0 and not params.presence_penalty
            and not params.frequency_penalty)


def greedy_tokens(rows: list[np.ndarray], biases: list[dict[int, float]]) -> list[int]:
    """Per row (logits [n_vocab]), the argmax after its logit_bias; raises NonFiniteLogitsError
    if a row holds NaN or +inf (or nothing finite), as Sampler.sample does."""
    return [_greedy(row if row.dtype == np.float32 else row.astype(np.float32), bias)
            for row, bias in zip(rows, biases)]


def _greedy(x: np.ndarray, bias: dict[int, float]) -> int:
    n = x.shape[0]
    biased = {t: b for t, b in bias.items() if 0 <= t < n}
    token = int(np.argmax(x))
    if biased and token in biased:  # the raw winner moves: argmax the biased copy
        x = x.copy()
        for t, b in biased.items():
            x[t] += b
        token = int(np.argmax(x))
    elif biased and np.isfinite(x[token]):
        # the raw winner is the first maximum of the unbiased tokens (and no NaN is anywhere,
        # or argmax would have returned the first): only the biased tokens can beat it.
        # x[t] + b is float32 arithmetic, as `x[t] += b` on the row is.
        best_value, best = x[token], token
        for t, b in biased.items():
            value = x[t] + b
            if value != value:  # a NaN bias: the biased row's max is NaN
                raise NonFiniteLogitsError(f"the model produced non-finite logits ({value})")
            if value > best_value or (value == best_value and t < best):
                best_value, best = value, t
        token = best
        if not np.isfinite(best_value):
            raise NonFiniteLogitsError(f"the model produced non-finite logits ({best_value})")
        return token
    best_value = x[token]
    if not np.isfinite(best_value):
        raise NonFiniteLogitsError(f"the model produced non-finite logits ({best_value})")
    return token
