"""Checks shared by the batching tests (engine/test_batching*.py and the gateway's tests that serve
the same models): run a BatchRunner dry, the engine's one-sequence path as the expectation, a
tolerance for ties, and the prompts both sides use."""
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


# SmolLM2's chat prompts (one long enough to be read in several chunks)
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain photosynthesis to a child in two sentences.",
    "List three prime numbers greater than 50.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue? " + "Please be detailed. " * 6,
    "Give me a name for a pet turtle.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
]

# Gemma 3's completion prompts (its file has no chat template)
COMPLETION_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "Three things to pack for a hike:",
    "The best way to learn a language is",
    "In 1969, the first people to walk on the Moon",
]
