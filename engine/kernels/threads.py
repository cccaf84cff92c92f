"""Splitting kernel work across threads by weight rows: the one place that decides how.

For now the workers are persistent Python threads (ctypes drops the GIL during a kernel call).
A round trip to them costs tens of microseconds, so work is split only when a part is big
enough to pay for it; a native worker pool will replace `RowSplitter` behind the same calls.

Worker life:   idle --task--> running --done--> idle ... --None (close)--> exited
"""
from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable

# A hand-off to a Python worker costs ~40 us, so a part must carry well over that in work. On
# the 2-core test machine (GEMV, one row of x) two threads broke even at ~2 MB of weights and
# ran 1.4-1.5x at 6-10 MB, 1.8x at 18-30 MB.
MIN_BYTES_PER_PART = 2 << 20


def split_rows(n_rows: int, n_parts: int) -> list[tuple[int, int]]:
    """[0, n_rows) as n_parts contiguous, near-equal, non-empty [r0, r1) ranges (fewer if small)."""
    n_parts = max(1, min(n_parts, n_rows))
    base, extra = divmod(n_rows, n_parts)
    bounds, r0 = [], 0
    for p in range(n_parts):
        r1 = r0 + base + (1 if p < extra else 0)
        bounds.append((r0, r1))
        r0 = r1
    return bounds


def parts_for(weight_bytes: int, n_rows: int, n_threads: int) -> int:
    """How many parts to split a matmul reading `weight_bytes` of weights into."""
    return max(1, min(n_threads, n_rows, weight_bytes // MIN_BYTES_PER_PART))


_Task = tuple[Callable[[int, int], None], int, int]  # fn, r0, r1


def _work(tasks: queue.SimpleQueue[_Task | None], done: queue.SimpleQueue[BaseException | None]) -> None:
    while (task := tasks.get()) is not None:
        fn, r0, r1 = task
        try:
            fn(r0, r1)
            done.put(None)
        except BaseException as exc:  # handed to the caller, which re-raises it
            done.put(exc)


def _stop(all_tasks: list[queue.SimpleQueue[_Task | None]]) -> None:
    for tasks in all_tasks:
        tasks.put(None)


class RowSplitter:
    """Runs fn(r0, r1) over a row range split across the caller and n_threads - 1 workers."""

    def __init__(self, n_threads: int) -> None:
        if n_threads < 1:
            raise ValueError(f"n_threads must be at least 1, got {n_threads}")
        self.n_threads = n_threads
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._tasks: list[queue.SimpleQueue[_Task | None]] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # one split at a time: workers serve one caller
        for k in range(n_threads - 1):
            tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
            t = threading.Thread(target=_work, args=(tasks, self._done), name=f"rows-{k + 1}",
                                 daemon=True)
            t.start()
            self._tasks.append(tasks)
            self._threads.append(t)
        # workers hold only their queues, so a splitter nobody closed can still be collected
        weakref.finalize(self, _stop, list(self._tasks))

    def run(self, fn: Callable[[int, int], None], n_rows: int, n_parts: int) -> None:
        """Call fn on each part of [0, n_rows); returns when all parts are done."""
        parts = split_rows(n_rows, min(n_parts, self.n_threads))
        if len(parts) == 1:
            fn(0, n_rows)
            return
        with self._lock:
            if not self._threads:
                raise RuntimeError("RowSplitter is closed")
            for tasks, (r0, r1) in zip(self._tasks, parts[1:]):
                tasks.put((fn, r0, r1))
            error: BaseException | None = None
            try:
                fn(*parts[0])
            except BaseException as exc:
                error = exc
            for _ in parts[1:]:  # always collect every worker before returning
                result = self._done.get()
                error = error or result
            if error is not None:
                raise error

    def close(self) -> None:
        with self._lock:
            _stop(self._tasks)
            for t in self._threads:
                t.join()
            self._threads.clear()
            self._tasks.clear()
