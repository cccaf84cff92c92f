"""Checks shared by the batching tests (test_batching.py, test_serve_gemma3.py): run a BatchRunner
dry, the engine's one-sequence path as the expectation, and a tolerance for ties."""
from __future__ import annotations

from typing import Any

from engine.batch import BatchRunner
from engine.sampling import SamplingParams


def run_all(runner: BatchRunner, max_steps: int = 10_000) -> int:
    steps = 0
    while runner.busy:
        runner.step()
        steps += 1
        assert steps < max_steps
    return steps


def alone(model: Any, ids: list[int], params: SamplingParams, n: int) -> list[int]:
    """The engine's one-sequence path: slot 0, nothing else evaluated alongside."""
    return [s.token for s in model.stream(ids, params, n, stop_at_eog=False)]


def assert_same_or_near_tie(model: Any, ids: list[int], expected: list[int], got: list[int]) -> None:
    if got == expected:
        return
    k = next(i for i, (a, b) in enumerate(zip(expected, got)) if a != b)
    logits = model.logits(ids + expected[:k])[-1]                       # [n_vocab]
    gap = abs(float(logits[expected[k]] - logits[got[k]]))
    assert gap < 0.05, f"split at token {k}: {expected[k]} vs {got[k]}, logit gap {gap:.3f}"
