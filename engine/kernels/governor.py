"""How many of the pool's threads a graph run should use: a pure policy over measured run times.

The thread count never changes a result (tasks split work; every output row and attention item
is computed whole by one thread), only the speed, and on a shared machine fewer threads can be
faster: when the OS deschedules one of ours, the others wait for it at every barrier. So per kind
of run (output kind and token count, bucketed) the governor remembers the last few run times of
each thread count it tried, runs the fastest, and retries another count every EXPLORE_EVERY
runs, so a machine that got busy or quiet again is noticed within a fraction of a second of
decoding.

Per kind:
    untried counts left --run one, time it--> (all tried) choosing the fastest
    choosing --every EXPLORE_EVERY runs of this kind--> one run with the next other count
"""
from __future__ import annotations

from collections import deque

EXPLORE_EVERY = 32  # runs between retries of a count that is not the fastest
SAMPLES = 3         # run times kept per (kind, count); their minimum is the estimate


class ThreadGovernor:
    def __init__(self, n_threads: int) -> None:
        if n_threads < 1:
            raise ValueError(f"n_threads must be at least 1, got {n_threads}")
        self.candidates = sorted({1, n_threads})  # all threads, or the caller alone
        self._times: dict[tuple[object, int], deque[float]] = {}
        self._runs: dict[object, int] = {}

    @staticmethod
    def kind(output: str, n_tokens: int) -> tuple[str, int]:
        """Runs comparable in cost: same output kind, token counts within a factor of two."""
        return output, n_tokens.bit_length()

    def estimate(self, kind: object, threads: int) -> float | None:
        times = self._times.get((kind, threads))
        return min(times) if times else None

    def choose(self, kind: object) -> int:
        """The thread count for the next run of this kind."""
        if len(self.candidates) == 1:
            return self.candidates[0]
        for n in reversed(self.candidates):  # all threads first
            if self.estimate(kind, n) is None:
                return n
        ranked = sorted(self.candidates, key=lambda n: self.estimate(kind, n))  # type: ignore[arg-type, return-value]
        runs = self._runs.get(kind, 0)
        if runs and runs % EXPLORE_EVERY == 0:
            return ranked[1 + (runs // EXPLORE_EVERY - 1) % (len(ranked) - 1)]
        return ranked[0]

    def record(self, kind: object, threads: int, seconds: float) -> None:
        """A run of this kind on `threads` threads took `seconds`."""
        self._runs[kind] = self._runs.get(kind, 0) + 1
        times = self._times.setdefault((kind, threads), deque(maxlen=SAMPLES))
        times.append(seconds)
