"""Pure policy: which loaded models to evict before a load, and which have been idle too long.

No I/O, no clocks, no locks: the registry describes its slots as `Resident` records, asks, and
carries out the answer. That keeps every rule here testable like a spec.

Rules:
- A load must fit both limits afterwards: resident count <= max_loaded_models and resident
  memory (weights + KV cache, estimates for models still loading) <= memory_budget.
- Only READY models with nothing in flight that are not pinned can be evicted, least recently
  used first. A model that is serving, loading or already draining is never chosen.
- Models already draining count as gone when choosing victims, so one load never evicts twice
  what it needs; the load still waits (`Blocked`) until they are unloaded and their memory free.
- When evicting every candidate would still not make room, nothing is evicted: the caller waits
  (`Blocked`) for requests to finish, unless the model could never fit (`TooLarge`).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.fleet.lifecycle import RESIDENT_STATES, ModelState
from gateway.units import format_size


@dataclass(frozen=True)
class Resident:
    """What the policy needs to know about one configured model."""

    key: str
    state: ModelState
    memory_bytes: int = 0      # actual when READY/DRAINING, the estimate while LOADING
    in_flight: int = 0
    pinned: bool = False
    last_used: float = 0.0     # monotonic seconds; the end of the last request (or the load)
    idle_timeout: float = 0.0  # seconds; 0 = never unload for idleness


@dataclass(frozen=True)
class Fits:
    """The load can start once these models (least recently used first) are unloaded."""

    evict: tuple[str, ...] = ()


@dataclass(frozen=True)
class Blocked:
    """No room now: models that are serving, loading or draining hold it. Wait and ask again."""

    reason: str


@dataclass(frozen=True)
class TooLarge:
    """The load can never fit, even with every evictable model gone. Fail the request."""

    reason: str


Plan = Fits | Blocked | TooLarge


def evictable(resident: Resident) -> bool:
    return resident.state is ModelState.READY and resident.in_flight == 0 and not resident.pinned


def plan_load(residents: Iterable[Resident], need_bytes: int, *, max_loaded: int,
              memory_budget: int) -> Plan:
    """Decide how to make room for a model of `need_bytes` that is not resident yet.

    `residents` may include models in any state; only RESIDENT_STATES count against the limits.
    """
    held = [r for r in residents if r.state in RESIDENT_STATES]
    # Pinned models stay for good, so they alone decide whether the load can ever fit.
    pinned_bytes = sum(r.memory_bytes for r in held if r.pinned)
    pinned_count = sum(1 for r in held if r.pinned)
    if need_bytes + pinned_bytes > memory_budget:
        return TooLarge(_too_large_reason(need_bytes, pinned_bytes, memory_budget))
    if pinned_count + 1 > max_loaded:
        return TooLarge(f"max_loaded_models is {max_loaded} and {pinned_count} pinned models "
                        "are always loaded")

    # Draining models are already on their way out: count them as gone when choosing what else
    # to evict, but wait for them before loading, since they hold their memory until unloaded.
    draining = [r for r in held if r.state is ModelState.DRAINING]
    count = len(held) - len(draining) + 1
    used = sum(r.memory_bytes for r in held) - sum(r.memory_bytes for r in draining) + need_bytes
    chosen: list[str] = []
    for r in sorted((r for r in held if evictable(r)), key=lambda r: r.last_used):
        if count <= max_loaded and used <= memory_budget:
            break
        chosen.append(r.key)
        count -= 1
        used -= r.memory_bytes
    if count > max_loaded or used > memory_budget:
        busy = [f"{r.key} ({_why_busy(r)})" for r in held if not r.pinned and not evictable(r)]
        return Blocked("no room until one of these is done: " + ", ".join(busy))
    if chosen or not draining:
        return Fits(tuple(chosen))
    if len(held) + 1 <= max_loaded and sum(r.memory_bytes for r in held) + need_bytes <= memory_budget:
        return Fits(())
    return Blocked("waiting for " + ", ".join(r.key for r in draining) + " to unload")


def _why_busy(r: Resident) -> str:
    if r.state is ModelState.READY:
        return f"{r.in_flight} in flight"
    return str(r.state.value)


def _too_large_reason(need: int, pinned: int, budget: int) -> str:
    text = f"needs {format_size(need)} (weights + KV cache) but memory_budget is {format_size(budget)}"
    if pinned:
        text += f" and pinned models hold {format_size(pinned)} of it"
    return text


def idle_expired(residents: Iterable[Resident], now: float) -> list[str]:
    """Keys of READY, unpinned models with nothing in flight, unused for their idle_timeout."""
    return [r.key for r in residents
            if _idles(r) and now - r.last_used >= r.idle_timeout]


def next_idle_deadline(residents: Sequence[Resident]) -> float | None:
    """The earliest moment (monotonic seconds) an idle unload can become due, or None."""
    deadlines = [r.last_used + r.idle_timeout for r in residents if _idles(r)]
    return min(deadlines, default=None)


def _idles(r: Resident) -> bool:
    return r.idle_timeout > 0 and evictable(r)
