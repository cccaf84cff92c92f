"""The registry's slots as gateway/fleet/eviction.py's pure policy sees them, and its answers as slots.

The policy decides over `Resident` records by key; this module describes the slots to it (a
file mapped by several slots counts once, keep_alive and pinning become idle timeouts and pins)
and turns its answers back into slots. Nothing here changes a slot: core.py carries the answer
out (drains, logs, counts).
"""
from __future__ import annotations

from collections.abc import Iterable

from gateway.config import RegistrySettings
from gateway.fleet.eviction import Plan, Resident, idle_expired, next_idle_deadline, plan_load
from gateway.fleet.lifecycle import RESIDENT_STATES
from gateway.fleet.registry.slots import Slot


def plan_for(slot: Slot, slots: list[Slot], limits: RegistrySettings) -> Plan:
    """What loading `slot` takes beside `slots`: which idle models to evict first (Fits), or why
    it must wait (Blocked) or cannot load at all (TooLarge)."""
    others = [s for s in slots if s is not slot]
    need = max(0, (slot.estimate or 0) - shared_bytes(slot, others))
    return plan_load(residents(slots, limits.idle_timeout), need,
                     max_loaded=limits.max_loaded_models, memory_budget=limits.memory_budget)


def memory_over(slot: Slot, slots: list[Slot], limits: RegistrySettings) -> int:
    """Bytes by which loading `slot` beside the resident slots would pass memory_budget."""
    others = [s for s in slots if s is not slot]
    need = max(0, (slot.estimate or 0) - shared_bytes(slot, others))
    held = sum(r.memory_bytes for r in residents(slots, limits.idle_timeout)
               if r.state in RESIDENT_STATES and r.key != resident_key(slot))
    return held + need - limits.memory_budget


def plan_to_fit(slots: list[Slot], limits: RegistrySettings) -> Plan:
    """Which idle models must go for the rest to fit `limits`: the plan for a load of nothing
    with one slot to spare answers exactly that (Blocked: busy models stand in the way)."""
    return plan_load(residents(slots, limits.idle_timeout), 0,
                     max_loaded=limits.max_loaded_models + 1, memory_budget=limits.memory_budget)


def idle(slots: list[Slot], limits: RegistrySettings, now: float) -> list[Slot]:
    """The slots idle past their timeout at `now` (monotonic)."""
    return by_key(slots, idle_expired(residents(slots, limits.idle_timeout), now))


def next_idle_time(slots: list[Slot], limits: RegistrySettings) -> float | None:
    """When (monotonic) the next slot idles out if nothing changes; None: none will."""
    return next_idle_deadline(residents(slots, limits.idle_timeout))


def by_key(slots: list[Slot], keys: Iterable[str]) -> list[Slot]:
    """The slots the policy names by `keys`."""
    slot_of = {resident_key(s): s for s in slots}
    return [slot_of[k] for k in keys]


def resident_key(slot: Slot) -> str:
    return slot.entry.name if not slot.retired else f"{slot.entry.name} (old, {id(slot):x})"


def shared_bytes(slot: Slot, before: list[Slot]) -> int:
    """Bytes of `slot` already counted for a slot in `before` that maps the same file
    (the page cache holds one copy of a file however often it is mapped)."""
    for other in before:
        if (other.entry.model == slot.entry.model and other.state in RESIDENT_STATES
                and other.model is not None):
            return other.model.mapped_bytes
    return 0


def residents(slots: list[Slot], default_idle: float) -> list[Resident]:
    """`slots` as the eviction policy sees them (gateway/fleet/eviction.py)."""
    def idle_timeout(s: Slot) -> float:
        if s.keep_alive is not None and 0 < s.keep_alive < float("inf"):
            return s.keep_alive
        return default_idle if s.entry.idle_timeout is None else s.entry.idle_timeout

    return [Resident(
        key=resident_key(s), state=s.state,
        memory_bytes=max(0, s.memory_bytes - shared_bytes(s, slots[:i])),
        in_flight=s.in_flight + s.awaiting_load,
        pinned=(s.entry.pinned or s.keep_alive == float("inf")) and not s.retired,
        last_used=s.last_used or 0.0, idle_timeout=idle_timeout(s),
    ) for i, s in enumerate(slots)]
