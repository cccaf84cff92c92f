"""Logits -> next token: penalties, bias, greedy or seeded random sampling, logprobs.

Order of operations (vLLM's and llama.cpp's, which agree here):
    logit_bias -> repetition/presence/frequency penalties -> [greedy if temperature == 0]
    -> top-k -> temperature -> softmax -> min-p -> top-p -> draw
Reported logprobs come from the model's own distribution (log-softmax of the raw logits), as
OpenAI reports them, whatever the sampling settings.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0                 # 0 = off
    top_p: float = 1.0             # 1 = off
    min_p: float = 0.0             # 0 = off
    repeat_penalty: float = 1.0    # llama.cpp's: divides positive logits of seen tokens (prompt + output)
    presence_penalty: float = 0.0  # OpenAI's: over generated tokens
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    top_logprobs: int = 0          # how many alternatives to report per token (0 = none)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be in [0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if self.top_logprobs < 0:
            raise ValueError("top_logprobs must be >= 0")


class NonFiniteLogitsError(ValueError):
    """The logits hold NaN or +inf: nothing can be sampled from them."""


@dataclass
class Sampled:
    token: int
    logprob: float                                     # log p(token) under the model
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


class Sampler:
    """Per-sequence sampling state: its RNG and the tokens it has seen."""

    def __init__(self, params: SamplingParams, prompt: list[int] | None = None) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.prompt_tokens = set(prompt or ())
        self.generated: Counter[int] = Counter()

    def accept(self, token: int) -> None:
        self.generated[token] += 1

    def _adjusted(self, logits: np.ndarray) -> np.ndarray:
        p = self.params
        x = logits.astype(np.float32, copy=True)  # [n_vocab]
        n = x.shape[0]
        for tok, bias in p.logit_bias.items():
            if 0 <= tok < n:
                x[tok] += bias
        if p.repeat_penalty != 1.0:
            seen = np.fromiter(self.prompt_tokens | set(self.generated), dtype=np.int64)
            seen = seen[(seen >= 0) & (seen < n)]
            vals = x[seen]
            x[seen] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self.generated:
            toks = np.fromiter(self.generated.keys(), dtype=np.int64)
            counts = np.fromiter(self.generated.values(), dtype=np.float32)
            x[toks] -= counts * p.frequency_penalty + p.presence_penalty
        return x

    def sample(self, logits: np.ndarray) -> Sampled:
        """Pick the next token from one position's logits [n_vocab] and record it."""
        p = self.params
        x = self._adjusted(logits)
        top = float(x.max())
        if not np.isfinite(top):  # NaN or +inf: broken weights or activations, not a choice
            raise NonFiniteLogitsError(f"the model produced non-finite logits ({top})")
        if p.temperature == 0.0:
            token = int(np.argmax(x))
        else:
            token = self._draw(x)
        self.accept(token)
        logp = log_softmax(logits)
        top: list[tuple[int, float]] = []
        if p.top_logprobs:
            k = min(p.top_logprobs, logp.shape[0])
            idx = np.argpartition(-logp, k - 1)[:k]
            idx = idx[np.argsort(-logp[idx], kind="stable")]
            top = [(int(i), float(logp[i])) for i in idx]
        return Sampled(token, float(logp[token]), top)

    def _draw(self, x: np.ndarray) -> int:
        p = self.params
        # candidates sorted by logit, descending: [n_cand]
        if 0 < p.top_k < x.shape[0]:
            cand = np.argpartition(-x, p.top_k - 1)[:p.top_k]
        else:
            cand = np.arange(x.shape[0])
        cand = cand[np.argsort(-x[cand], kind="stable")]
        z = x[cand].astype(np.float64) / p.temperature
        probs = np.exp(z - z[0])
        probs /= probs.sum()
        keep = probs.shape[0]
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        if p.top_p < 1.0:
            cum = np.cumsum(probs[:keep])
            keep = min(keep, int(np.searchsorted(cum, p.top_p * cum[-1])) + 1)
        keep = max(keep, 1)
        probs = probs[:keep] / probs[:keep].sum()
        return int(cand[self.rng.choice(keep, p=probs)])
