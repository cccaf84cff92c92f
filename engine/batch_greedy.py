"""Greedy picks for a whole batch: the common serving case in one numpy pass per row, no Sampler
call, no copy of a row without a logit_bias, no separate max.

`Sampler.sample` with temperature 0 copies the row to float32, adds logit_bias, takes the max
(to refuse NaN / +inf), then the argmax: three passes over 49k floats and a few Python calls,
per sequence per step. When a sequence has no grammar mask, no penalties and asks for no
logprobs, the same token comes from one argmax: numpy's argmax returns the first NaN if there is
one, else the first maximum, so the value at the argmax is non-finite exactly when the row's max
is. The bias is added in float32 (as `Sampler._adjusted` does) to a copy of only the rows that
have one. Sampler.sample is this module's twin: tests/engine/test_batch_greedy.py compares them
bit for bit (ties, biases, NaN, +inf, -inf rows).
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
    tokens: list[int] = []
    for row, bias in zip(rows, biases):
        x = row if row.dtype == np.float32 else row.astype(np.float32)
        if bias:
            n = x.shape[0]
            x = x.copy() if x is row else x
            for tok, b in bias.items():
                if 0 <= tok < n:
                    x[tok] += b
        token = int(np.argmax(x))
        best = float(x[token])
        if not np.isfinite(best):
            raise NonFiniteLogitsError(f"the model produced non-finite logits ({best})")
        tokens.append(token)
    return tokens
