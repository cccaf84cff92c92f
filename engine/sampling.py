"""Logits -> next token: penalties, bias, greedy or seeded random sampling, logprobs.

Order of operations (vLLM's and llama.cpp's, which agree here):
    [grammar mask: disallowed tokens -> -inf] -> logit_bias -> repetition/presence/frequency penalties
    -> [greedy if temperature == 0] -> top-k -> temperature -> softmax -> min-p -> top-p -> draw
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
    logprobs: bool = True          # report the chosen token's logprob (False: nan, one pass
                                   # over the vocabulary saved per token)

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
    logprob: float                                     # log p(token) under the model (nan if not asked)
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


# Tokens this many nats below the best one carry less than e^-30 of its probability each, so
# sampling leaves them out of the sort (their total mass is < n_vocab * 1e-13 of the best's).
NEGLIGIBLE_NATS = 30.0


class Sampler:
    """Per-sequence sampling state: its RNG and the tokens it has seen."""

    def __init__(self, params: SamplingParams, prompt: list[int] | None = None) -> None:
        self.params = params
        # any integer seeds (OpenAI's are signed); numpy takes only non-negative ones
        self.rng = np.random.default_rng(None if params.seed is None else params.seed % 2**64)
        self.prompt_tokens = set(prompt or ())
        self.generated: Counter[int] = Counter()

    def accept(self, token: int) -> None:
        self.generated[token] += 1

    def forget(self, tokens: list[int]) -> None:
        """Take back accepted tokens (a rollback): penalties no longer count them."""
        self.generated.subtract(tokens)
        self.generated = +self.generated  # drop zero counts: presence penalties read the keys

    def _adjusted(self, logits: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
        p = self.params
        x = logits.astype(np.float32, copy=True)  # [n_vocab]
        n = x.shape[0]
        if allowed is not None:  # bool [n_vocab] from a grammar (engine/constraint.py)
            np.copyto(x, np.float32(-np.inf), where=~allowed)
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

    def sample(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> Sampled:
        """Pick the next token from one position's logits [n_vocab] and record it; `allowed`
        (bool [n_vocab]) restricts the choice to a grammar's tokens."""
        x, best = self._checked(logits, allowed)
        token = int(np.argmax(x)) if self.params.temperature == 0.0 else self._draw(x, best)
        return self._report(token, logits)

    def verify(self, logits: np.ndarray, draft: int) -> tuple[Sampled, bool]:
        """Speculative decoding's check of a drafted token against this position's logits:
        (the token taken, whether it is the draft). The token is `sample`'s, drawn with the
        same random numbers, and the draft is kept when it is that token (llama.cpp's
        common_sampler_sample_and_accept_n). So P(t) = p(t), and a seeded request gives the
        same tokens with drafts as without. For a drafter that proposes one token for certain
        (prompt lookup, a greedy draft model) this is the speculative-sampling papers'
        rejection step exactly: the draft is kept with probability p(draft), and otherwise the
        token follows p with the draft removed, renormalised."""
        sampled = self.sample(logits)
        return sampled, sampled.token == draft

    def _checked(self, logits: np.ndarray, allowed: np.ndarray | None) -> tuple[np.ndarray, float]:
        x = self._adjusted(logits, allowed)
        best = float(x.max())
        if not np.isfinite(best):  # NaN or +inf: broken weights or activations, not a choice
            if allowed is not None and best == -np.inf and np.isfinite(logits).all():
                raise NonFiniteLogitsError("the grammar allows no token here")
            raise NonFiniteLogitsError(f"the model produced non-finite logits ({best})")
        return x, best

    def _report(self, token: int, logits: np.ndarray) -> Sampled:
        """Record the token taken, with the logprobs asked for."""
        p = self.params
        self.accept(token)
        if not (p.logprobs or p.top_logprobs):
            return Sampled(token, float("nan"))
        raw = np.asarray(logits, dtype=np.float32)                       # [n_vocab]
        m = float(raw.max())
        lse = m + float(np.log(np.exp(raw - m).sum(dtype=np.float64)))  # log sum exp
        top: list[tuple[int, float]] = []
        if p.top_logprobs:
            k = min(p.top_logprobs, raw.shape[0])
            idx = np.argpartition(-raw, k - 1)[:k]
            idx = idx[np.argsort(-raw[idx], kind="stable")]
            top = [(int(i), float(raw[i]) - lse) for i in idx]
        return Sampled(token, float(raw[token]) - lse, top)

    def _distribution(self, x: np.ndarray, best: float) -> tuple[np.ndarray, np.ndarray]:
        """The tokens a random draw may take and their unnormalised weights."""
        p = self.params
        z = x / np.float32(p.temperature)                                 # [n_vocab]
        z_best = best / p.temperature
        if 0 < p.top_k < x.shape[0]:
            cand = np.argpartition(-z, p.top_k - 1)[:p.top_k]
        else:  # only tokens that could matter: the rest weigh < e^-30 of the best each
            cand = np.flatnonzero(z >= z_best - NEGLIGIBLE_NATS)
        w = np.exp(z[cand].astype(np.float64) - z_best)                   # [n_cand], best == 1
        if p.min_p > 0.0:  # w is each token's probability relative to the best one's
            cand, w = cand[w >= p.min_p], w[w >= p.min_p]
        if p.top_p < 1.0:
            cand, w = _nucleus(cand, w, p.top_p)
        return cand, w

    def _draw(self, x: np.ndarray, best: float) -> int:
        return self._pick(*self._distribution(x, best))

    def _pick(self, cand: np.ndarray, w: np.ndarray) -> int:
        cum = np.cumsum(w)
        r = self.rng.random() * cum[-1]
        return int(cand[min(int(np.searchsorted(cum, r, side="right")), cand.shape[0] - 1)])


def _nucleus(cand: np.ndarray, w: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The most probable tokens whose mass first reaches top_p of the total, best first.

    Sorts only a growing top slice (64, 256, ... tokens) instead of the whole vocabulary.
    """
    target = top_p * float(w.sum())
    k = 64
    while True:
        if k >= w.shape[0]:
            order = np.argsort(-w, kind="stable")
            break
        part = np.argpartition(-w, k - 1)[:k]
        if float(w[part].sum()) >= target:
            order = part[np.argsort(-w[part], kind="stable")]
            break
        k *= 4
    n = int(np.searchsorted(np.cumsum(w[order]), target)) + 1
    order = order[:n]
    return cand[order], w[order]
