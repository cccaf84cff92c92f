"""Stand-ins for loaded models: the registry's tests and the admin endpoints' tests load these
instantly instead of a GGUF (what the registry reads of a model: memory_bytes, close(), and the
served model's queued/active counts)."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from gateway.config import ModelEntry
from gateway.registry import Registry

T = TypeVar("T")
MB = 1 << 20


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 30))


class FakeModel:
    def __init__(self, entry: ModelEntry, memory_bytes: int):
        self.entry = entry
        self.memory_bytes = memory_bytes
        self.closed = False

    def close(self) -> None:
        self.closed = True


class RecordingLoader:
    """Loads instantly (or when `gate` opens); fails for the names in `fail`."""

    def __init__(self, sizes: dict[str, int] | None = None):
        self.sizes = sizes or {}
        self.loads: list[str] = []
        self.models: list[FakeModel] = []
        self.fail: dict[str, Exception] = {}
        self.gate: threading.Event | None = None

    def __call__(self, entry: ModelEntry) -> FakeModel:  # runs in a worker thread
        if self.gate is not None:
            self.gate.wait(10)
        self.loads.append(entry.name)
        if entry.name in self.fail:
            raise self.fail.pop(entry.name)
        model = FakeModel(entry, self.sizes.get(entry.name, MB))
        self.models.append(model)
        return model

    def estimate(self, entry: ModelEntry) -> int:
        return self.sizes.get(entry.name, MB)

    def closed(self) -> list[str]:
        return [m.entry.name for m in self.models if m.closed]


def state(registry: Registry, name: str) -> str:
    [row] = [r for r in registry.snapshot() if name in r["aliases"] and not r["retiring"]]
    return str(row["state"])


class FakeServed:
    """Shaped like served_model.ServedModel: it reports the counts of its queue and slots
    (test_scheduler.py checks that the real one reads them from its scheduler)."""

    def __init__(self, entry: ModelEntry) -> None:
        self.entry = entry
        self.memory_bytes = 3 * MB
        self.queued = 0
        self.active = 0
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Loader:
    def __init__(self) -> None:
        self.loaded: list[FakeServed] = []

    def __call__(self, entry: ModelEntry) -> FakeServed:
        served = FakeServed(entry)
        self.loaded.append(served)
        return served
