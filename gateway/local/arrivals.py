"""Requests on their way to a model's scheduler: planned (template, tokenizing) but not submitted.

Clients that start together (a burst of chat requests, the n streams of an app) reach the
scheduler a few milliseconds apart: each is parsed on the event loop, then planned on the
model's prep threads. An idle scheduler that steps as soon as the first one lands reads that
prompt alone and the others one step later, so the last first token comes a whole prompt step
late. `Arrivals` tells the scheduler how many requests are still being planned, so an idle one
can wait (briefly, gateway/local/scheduler.py's GATHER_WAIT) and read their prompts in one step.

A request counts from its first `planning()` call (ServedModel.prepare, on the event loop, in
the request's task) until `submitted()` in the same task, or until that task ends (a 400 in
planning, a client gone): nothing can hold the count up past its request's life.

    not counted --planning()--> on its way --submitted()--> not counted
                                    |
                                    +-- its task ends (error, cancel) --> not counted
"""
from __future__ import annotations

import asyncio
import threading


class Arrivals:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()
        self._lock = threading.Lock()  # the scheduler thread counts, the event loop adds

    def planning(self) -> None:
        """The calling request (its asyncio task) is being planned for this model."""
        task = asyncio.current_task()
        if task is not None:
            with self._lock:
                self._tasks.add(task)

    def submitted(self) -> None:
        """The calling request reached the scheduler (or will not come)."""
        task = asyncio.current_task()
        if task is not None:
            with self._lock:
                self._tasks.discard(task)

    def count(self) -> int:
        """Requests on their way now (any thread)."""
        with self._lock:
            ended = {t for t in self._tasks if t.done()}
            self._tasks -= ended
            return len(self._tasks)
