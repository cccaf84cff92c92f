"""The last 15 minutes of per-model activity, so the console's Activity chart has history the
first time it opens (GET /metrics/activity; as public as /metrics).

Metrics feeds every event here as it counts it (requests, errors, tokens, time to first token,
batch sizes). The history is a ring of snapshots of the running totals per model alias, the
same totals the page computes from /metrics, one at most every STEP seconds: a snapshot is
taken before the first event of a new step is added (so it holds exactly what happened before
its time) and when the history is read. Rates come from consecutive snapshots, as the page
computes them from its own samples; an idle stretch is one long interval at rate 0.

Memory is bounded: WINDOW / STEP snapshots, each one small mapping per alias seen (aliases are
configured names, as /metrics labels are).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

WINDOW = 15 * 60.0   # seconds of history kept
STEP = 5.0           # seconds between snapshots, at most
FIELDS = ("requests", "errors", "prompt", "completion", "ttftSum", "ttftCount", "batchSum",
          "batchCount")  # the page's names (gateway/api/console/static/activity.js)


class ActivityHistory:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()  # batch sizes arrive from scheduler threads
        self._totals: dict[str, dict[str, float]] = {}
        self._ring: deque[tuple[float, dict[str, dict[str, float]]]] = deque()
        self._last = -float("inf")
        self._read_tail = False  # the ring's last snapshot is a reader's "present"

    def _snapshot(self, now: float) -> None:
        """Keep the totals as of `now` when a step has passed (call with the lock held)."""
        if now - self._last < STEP:
            return
        self._last = now
        self._read_tail = False
        self._ring.append((now, {m: dict(t) for m, t in self._totals.items()}))
        while self._ring and now - self._ring[0][0] > WINDOW:
            self._ring.popleft()

    def _add(self, model: str, **amounts: float) -> None:
        with self._lock:
            self._snapshot(self._clock())
            totals = self._totals.setdefault(model, dict.fromkeys(FIELDS, 0.0))
            for name, amount in amounts.items():
                totals[name] += amount

    def request(self, model: str, status: int) -> None:
        self._add(model, requests=1, errors=1 if status >= 400 else 0)

    def first_token(self, model: str, seconds: float) -> None:
        self._add(model, ttftSum=seconds, ttftCount=1)

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        self._add(model, prompt=prompt, completion=completion)

    def batch(self, model: str, size: int) -> None:
        self._add(model, batchSum=size, batchCount=1)

    def history(self) -> dict[str, Any]:
        """{"window": s, "step": s, "samples": [{"t": unix time, "models": {alias: totals}}]}:
        the page's own sample format, oldest first, the last one taken now."""
        with self._lock:
            now = self._clock()
            present = (now, {m: dict(t) for m, t in self._totals.items()})
            if self._read_tail:
                self._ring[-1] = present  # readers get the present without growing the ring
            else:
                self._ring.append(present)
                self._read_tail = True
            samples = [{"t": t, "models": models} for t, models in self._ring]
        return {"window": WINDOW, "step": STEP, "samples": samples}
