"""How many of the pool's threads a graph run should use: a pure policy over measured run times.

The thread count never changes a result (tasks split work; every output row and attention item
is computed whole by one thread), only the speed, and on a shared machine fewer threads can be
faster: when the OS deschedules one of ours, the others wait for it at every barrier. So per kind
of run (output kind and token count, bucketed) the governor remembers the last few run times of
each thread count it tried and runs the fastest. A kind starts on all threads and tries another
count only at its EXPLORE_EVERY-th run: a rare kind (the steps that read a burst of new prompts)
never pays for a trial on one thread. A retry that loses doubles the wait before the next, up to
EXPLORE_MAX runs; one that wins resets it. A run more than SLOW_FACTOR times slower than its
count's estimate (the machine got busy) makes the next run a retry at once.

Per kind:
    all threads, waiting --runs reach `due`--> retry: one run on the other count
    retry --it lost--> waiting, interval doubled (at most EXPLORE_MAX), due = runs + interval
    retry --it won--> waiting on the new fastest, interval EXPLORE_EVERY
    waiting --a run > SLOW_FACTOR x its estimate--> retry next run, interval EXPLORE_EVERY
(Measured on the 1.1B Q4_K_M server, 8 clients, scripts/bench_serve.py: trying one thread on a
kind's second run cost 122 vs 137 tok/s with every run on two threads.)
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

EXPLORE_EVERY = 32  # runs of a kind before its first retry, and after a retry that won
EXPLORE_MAX = 256   # the longest wait between retries, after retries kept losing
SLOW_FACTOR = 2.0   # a run this much slower than its estimate retries at once (token counts
                    # vary less than 2x within a kind)
SAMPLES = 3         # run times kept per (kind, count); their minimum is the estimate


@dataclass
class _Kind:
    runs: int = 0
    interval: int = EXPLORE_EVERY
    due: int = EXPLORE_EVERY   # the run index of the next retry


class ThreadGovernor:
    def __init__(self, n_threads: int) -> None:
        if n_threads < 1:
            raise ValueError(f"n_threads must be at least 1, got {n_threads}")
        self.candidates = sorted({1, n_threads})  # all threads, or the caller alone
        self._times: dict[tuple[object, int], deque[float]] = {}
        self._kinds: dict[object, _Kind] = {}

    @staticmethod
    def kind(output: str, n_tokens: int, attended: int = 0) -> tuple[str, int, int]:
        """Runs comparable in cost: same output kind, token counts and attention work (`attended`:
        the sum over the run's tokens of the cached rows each attends to) within a factor of two.
        Without the attention term, the chunks of a long prompt (same kind, each slower than the
        last as the cache deepens) looked like a busy machine and set off a retry on one thread
        every other chunk (2x slower each: 6,000 tokens of SmolLM2 in 14.7 s instead of 10.9)."""
        return output, n_tokens.bit_length(), attended.bit_length()

    def estimate(self, kind: object, threads: int) -> float | None:
        times = self._times.get((kind, threads))
        return min(times) if times else None

    def choose(self, kind: object) -> int:
        """The thread count for the next run of this kind."""
        if len(self.candidates) == 1:
            return self.candidates[0]
        best = self._fastest(kind)
        if best is None:
            return self.candidates[-1]
        state = self._kinds[kind]  # a count has an estimate: the kind has run
        if state.runs < state.due:
            return best
        return self.candidates[0] if best == self.candidates[-1] else self.candidates[-1]

    def _fastest(self, kind: object) -> int | None:
        tried = [n for n in self.candidates if self.estimate(kind, n) is not None]
        if self.candidates[-1] not in tried:
            return None  # all threads first
        return min(tried, key=lambda n: self.estimate(kind, n))  # type: ignore[arg-type, return-value]

    def record(self, kind: object, threads: int, seconds: float) -> None:
        """A run of this kind on `threads` threads took `seconds`."""
        state = self._kinds.setdefault(kind, _Kind())
        best, before = self._fastest(kind), self.estimate(kind, threads)
        times = self._times.setdefault((kind, threads), deque(maxlen=SAMPLES))
        times.append(seconds)
        state.runs += 1
        if best is not None and threads != best:  # a retry
            won = self._fastest(kind) == threads
            state.interval = EXPLORE_EVERY if won else min(2 * state.interval, EXPLORE_MAX)
            state.due = state.runs + state.interval
        elif before is not None and seconds > SLOW_FACTOR * before:
            state.interval, state.due = EXPLORE_EVERY, state.runs
