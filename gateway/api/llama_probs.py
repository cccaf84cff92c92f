"""llama-server's `post_sampling_probs`: the probabilities a token had after the sampler's filters.

llama.cpp (tools/server/server-context.cpp `populate_token_probs`) reports, for each generated
token, the candidates left after its sampler chain (common/sampling.cpp's default order
top_k -> top_p -> min_p -> temperature, then a softmax), sorted, their `prob`s summing to 1,
zeros dropped. Here the same filters run over the model's top log-probabilities (log-softmax of
the raw logits): top_k renormalises within the k kept, top_p takes the shortest prefix whose
renormalised mass reaches p, min_p keeps tokens at least min_p times the best, temperature
sharpens or flattens what is left. Asking the sampler for max(n_probs, top_k) alternatives makes
this exact whenever top_k is on; with top_k off, the set is the first POOL candidates. Penalties
and logit biases are not in the reported probabilities.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

POOL = 128  # candidates looked at when top_k is off


def candidates_needed(n_probs: int, top_k: int) -> int:
    """How many top log-probabilities the sampler must report for the filters below."""
    return max(n_probs, top_k if top_k > 0 else POOL)


def post_sampling(top: Sequence[tuple[int, float]], *, top_k: int, top_p: float, min_p: float,
                  temperature: float) -> list[tuple[int, float]]:
    """(id, logprob) candidates, best first -> (id, prob) after the filters, best first."""
    kept = sorted(top, key=lambda c: -c[1])
    if top_k > 0:
        kept = kept[:top_k]
    if not kept:
        return []
    if temperature <= 0:  # greedy: the best token only
        return [(kept[0][0], 1.0)]
    if top_p < 1.0:
        # over the k kept when top_k is on; else the log-probabilities are already the
        # whole vocabulary's (the pool is cut where its mass reaches p, or kept whole)
        weights = [math.exp(lp) for _, lp in kept]
        total, running, cut = sum(weights) if top_k > 0 else 1.0, 0.0, len(kept)
        for i, w in enumerate(weights):
            running += w
            if running / total >= top_p:
                cut = i + 1
                break
        kept = kept[:cut]
    if min_p > 0.0:
        floor = kept[0][1] + math.log(min_p)
        kept = [c for c in kept if c[1] >= floor]
    best = kept[0][1]
    weights = [math.exp((lp - best) / temperature) for _, lp in kept]
    total = sum(weights)
    return [(tok, w / total) for (tok, _), w in zip(kept, weights) if w > 0.0]
