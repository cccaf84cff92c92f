"""Stand-ins for loaded models: the registry's tests and the admin endpoints' tests load these
instantly instead of a GGUF. FakeModel has every member of what the registry reads of a served
model (gateway/fleet/registry/slots.py's Loaded); a test sets the ones it is about."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from gateway.config import ModelEntry
from gateway.fleet.registry import Registry

T = TypeVar("T")
MB = 1 << 20


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 30))


class FakeModel:
    """Shaped like served_model.ServedModel as the registry sees it (test_scheduler.py checks
    that the real one reads its counts from its scheduler)."""

    def __init__(self, entry: ModelEntry, memory_bytes: int = MB) -> None:
        self.entry = entry
        self.memory_bytes = memory_bytes
        self.mapped_bytes = 0     # of memory_bytes, the file mapping other loads share
        self.broken: str | None = None
        self.chat_format: str | None = None
        self.queued = 0
        self.active = 0
        self.aborted: BaseException | None = None
        self.closed = False

    def occupancy(self) -> tuple[int, int]:
        return self.queued, self.active

    def abort(self, error: BaseException) -> None:
        self.aborted = error

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


class Loader:
    """Loads instantly; each model is 3 MiB."""

    def __init__(self) -> None:
        self.loaded: list[FakeModel] = []

    def __call__(self, entry: ModelEntry) -> FakeModel:
        served = FakeModel(entry, 3 * MB)
        self.loaded.append(served)
        return served
