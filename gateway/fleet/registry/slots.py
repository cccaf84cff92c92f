"""The registry's records: one slot per configured model, the lease a request holds, the rows
/admin/models shows, and the helpers that read them.

Only gateway/fleet/registry/core.py writes a slot's state; everything here reads slots.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypedDict

from gateway.config import ModelEntry
from gateway.fleet.lifecycle import ModelState
from gateway.generation.model import GenerativeModel


class Loaded(Protocol):
    """What the registry needs of what its loader returns: gateway/local/served_model.py's ServedModel
    (mypy checks it there), or a test's stand-in (tests/support/fakes.py). The sizes and close()
    are engine/loaded.py's LoadedModel's; the rest is its scheduler's, for the rows and the
    checks before and after each request."""

    @property
    def memory_bytes(self) -> int: ...        # the most it holds resident

    @property
    def mapped_bytes(self) -> int: ...        # of that, the file mapping other loads share

    @property
    def broken(self) -> str | None: ...       # why it must stop serving (a stat per call), or None

    @property
    def chat_format(self) -> str | None: ...  # which chat template, and why

    def occupancy(self) -> tuple[int, int]: ...  # requests (waiting for a slot, in a slot)

    def abort(self, error: BaseException) -> None: ...  # end what it runs and queues (shutdown)

    def close(self) -> None: ...


class Servable(Loaded, GenerativeModel, Protocol):
    """What a loader makes: Loaded for the registry, a GenerativeModel for whoever holds a lease
    on it (gateway/generation/model.py)."""


Loader = Callable[[ModelEntry], Servable]
Estimator = Callable[[ModelEntry], int]


def engine_estimator(entry: ModelEntry) -> int:
    import engine
    from engine.vision import projector_memory

    # one KV cache of n_ctx per parallel slot, as the scheduler loads it; the projector's
    # weights are read into memory of their own: its file's size, more where the AMX GEMM
    # packs F16 weights as bf16 halves (engine/vision/mmproj.py resident_bytes)
    text = int(engine.estimate_memory(entry.model, entry.n_ctx, n_slots=entry.n_parallel,
                                      images=entry.mmproj is not None,
                                      lora=[engine.LoraSpec(a.path, a.scale) for a in entry.lora],
                                      type_k=entry.kv_cache_types[0],
                                      type_v=entry.kv_cache_types[1]))
    draft = entry.draft.model if entry.draft is not None else None
    small = (int(engine.estimate_memory(draft, entry.n_ctx, n_slots=entry.n_parallel))
             if draft is not None else 0)  # the draft model: its own weights and KV slots
    pool = entry.prompt_cache_bytes  # the prompt cache's budget: it may fill
    projector = projector_memory(entry.mmproj) if entry.mmproj is not None else 0
    return text + small + pool + projector


@dataclass(eq=False)
class Slot:
    """One configured model and everything the registry knows about it."""

    entry: ModelEntry
    state: ModelState = ModelState.UNLOADED
    model: Servable | None = None
    memory_bytes: int = 0             # actual once loaded; the estimate while loading
    estimate: int | None = None       # bytes a load will take, asked once per slot
    estimating: asyncio.Future[int | str] | None = None  # the estimate being worked out
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
    held: Servable | None  # the loader's object; cleared on release so no reference outlives use
    alias: str
    _slot: Slot = field(repr=False)
    released: bool = False

    @property
    def model(self) -> Servable:
        """The leased model; a released lease has none (RuntimeError)."""
        if self.held is None:
            raise RuntimeError(f"the lease on {self.alias} was released")
        return self.held


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
    mmproj: str | None             # the vision projector file: the entry takes images
    last_used: float | None        # unix time
    load_seconds: float | None
    load_count: int
    last_error: str | None
    retiring: bool
    keep_alive: float | None       # -1 = keep loaded


def row(slot: Slot) -> ModelRow:
    model = slot.model
    queued, active = model.occupancy() if model is not None else (0, 0)
    return ModelRow(
        kind="local",
        model=str(slot.entry.model),
        aliases=list(slot.entry.aliases),
        state=slot.state.value,
        pinned=slot.entry.pinned,
        memory_bytes=slot.memory_bytes,
        in_flight=slot.in_flight,
        queued=queued,
        active=active,
        n_ctx=slot.entry.n_ctx,
        chat_format=model.chat_format if model is not None else None,
        mmproj=None if slot.entry.mmproj is None else str(slot.entry.mmproj),
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
    """Why a loaded model must stop serving, or None (also for no model); a stat per call."""
    return None if model is None else model.broken
