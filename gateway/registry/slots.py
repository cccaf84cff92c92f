"""The registry's records: one slot per configured model, the lease a request holds, the rows
/admin/models shows, and the helpers that read them.

Only gateway/registry/core.py writes a slot's state; everything here reads slots.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict

from gateway.config import ModelEntry
from gateway.lifecycle import ModelState


class Loaded(Protocol):
    """What a loader returns: any object that knows its size and can be closed."""

    @property
    def memory_bytes(self) -> int: ...

    def close(self) -> None: ...


Loader = Callable[[ModelEntry], Loaded]
Estimator = Callable[[ModelEntry], int]



def engine_loader(entry: ModelEntry) -> Loaded:
    import engine

    return engine.load(entry.model, n_ctx=entry.n_ctx, n_threads=entry.n_threads)


def engine_estimator(entry: ModelEntry) -> int:
    import engine

    # one KV cache of n_ctx per parallel slot, as the scheduler loads it
    return int(engine.estimate_memory(entry.model, entry.n_ctx, n_slots=entry.n_parallel))


@dataclass(eq=False)
class Slot:
    """One configured model and everything the registry knows about it."""

    entry: ModelEntry
    state: ModelState = ModelState.UNLOADED
    model: Loaded | None = None
    memory_bytes: int = 0             # actual once loaded; the estimate while loading
    estimate: int | None = None       # bytes a load will take, asked once per slot
    in_flight: int = 0
    awaiting_load: int = 0            # requests waiting for this load: they hold it like in_flight
    last_used: float | None = None    # monotonic: end of the last request, or the load
    load_task: asyncio.Task[str | None] | None = None
    load_seconds: float | None = None
    load_count: int = 0
    last_error: str | None = None
    broken: str | None = None         # why a loaded model stopped serving: FAILED once unloaded
    retired: bool = False             # left the config (apply): drains, unloads, then goes
    keep_alive: float | None = None   # the last request's keep_alive (s): None = the config's,
                                      # 0 = unload when idle, inf = keep loaded (as pinned)


@dataclass(eq=False)
class Lease:
    """A ready model, counted in flight until `Registry.release(lease)`."""

    entry: ModelEntry
    model: Any            # the loader's object; cleared on release so no reference outlives use
    alias: str
    _slot: Slot = field(repr=False)
    released: bool = False


@dataclass(frozen=True)
class ApplyResult:
    """What `Registry.apply` did, by first alias."""

    kept: list[str]       # same file and settings: stay loaded
    reloaded: list[str]   # same file, new settings: the old one drains, the new loads on demand
    added: list[str]
    removed: list[str]    # drain, then unload



class ModelRow(TypedDict):
    """A local entry as /admin/models, the console and the metrics see it."""

    kind: Literal["local"]
    model: str                     # the GGUF file
    aliases: list[str]
    state: str                     # a ModelState value
    pinned: bool
    memory_bytes: int
    in_flight: int
    queued: int
    active: int
    n_ctx: int
    chat_format: str | None        # which template, and why
    last_used: float | None        # unix time
    load_seconds: float | None
    load_count: int
    last_error: str | None
    retiring: bool
    keep_alive: float | None       # -1 = keep loaded


def row(slot: Slot) -> ModelRow:
    chat_format = getattr(slot.model, "chat_format", None)
    return ModelRow(
        kind="local",
        model=str(slot.entry.model),
        aliases=list(slot.entry.aliases),
        state=slot.state.value,
        pinned=slot.entry.pinned,
        memory_bytes=slot.memory_bytes,
        in_flight=slot.in_flight,
        queued=scheduler_count(slot.model, "queued"),
        active=scheduler_count(slot.model, "active"),
        n_ctx=slot.entry.n_ctx,
        chat_format=chat_format if isinstance(chat_format, str) else None,
        last_used=(None if slot.last_used is None
                   else time.time() - (time.monotonic() - slot.last_used)),
        load_seconds=slot.load_seconds,
        load_count=slot.load_count,
        last_error=slot.last_error,
        retiring=slot.retired,
        keep_alive=-1 if slot.keep_alive == float("inf") else slot.keep_alive,
    )


def slot_key(entry: ModelEntry) -> str:
    # Keyed by entry, not by file: several entries may serve one file with their own settings.
    return entry.name  # the first alias; aliases are unique across entries


def broken(model: Loaded | None) -> str | None:
    """Why a loaded model must stop serving (scheduler.ServedModel.broken, or its file changed
    under the mapping), else None. A stat per call; objects without these checks never break."""
    why = getattr(model, "broken", None)
    if isinstance(why, str):
        return why
    check = getattr(model, "file_changed", None)
    return check() if callable(check) else None


def scheduler_count(model: Loaded | None, name: str) -> int:
    """A count a served model keeps (`queued`: waiting for a slot, `active`: holding one; see
    scheduler.ServedModel); 0 for a loaded object without a scheduler."""
    n = getattr(model, name, None)
    return n if isinstance(n, int) else 0
