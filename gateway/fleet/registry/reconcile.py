"""Which slots a new config continues: the diff behind Registry.apply, with no effects.

An entry of the new config continues the old slot of the same file (and a shared alias, where
several entries serve one file). With the same settings_key() the slot stays (its loaded model
warm) and takes the new entry: aliases, pinning, idle timeout. With other settings, or with no
entry left, the old slot retires and the entry gets a fresh slot; core.py drains what retires.
"""
from __future__ import annotations

from gateway.config import ModelEntry
from gateway.fleet.registry.slots import ApplyResult, Slot, slot_key


def reconcile(old: dict[str, Slot], models: list[ModelEntry]
              ) -> tuple[dict[str, Slot], list[Slot], ApplyResult]:
    """The new slot table for `models`, the old slots to retire (reloaded ones first, in config
    order, then removed ones) and what happened by first alias. A kept slot takes its new entry
    here; nothing else is changed."""
    left = dict(old)
    slots: dict[str, Slot] = {}
    retiring: list[Slot] = []
    kept, reloaded, added = [], [], []
    for entry in models:
        slot = match(left, entry)
        if slot is not None:
            left.pop(slot_key(slot.entry))
        if slot is not None and slot.entry.settings_key() == entry.settings_key():
            slot.entry = entry
            slots[slot_key(entry)] = slot
            kept.append(entry.name)
            continue
        if slot is not None:
            retiring.append(slot)
            reloaded.append(entry.name)
        else:
            added.append(entry.name)
        slots[slot_key(entry)] = Slot(entry)
    retiring += left.values()
    return slots, retiring, ApplyResult(kept, reloaded, added, [s.entry.name for s in left.values()])


def match(old: dict[str, Slot], entry: ModelEntry) -> Slot | None:
    """The old slot a reloaded entry continues: the same file and a shared alias, or else the
    one old entry of that file (its aliases were all renamed)."""
    same_file = [s for s in old.values() if s.entry.model == entry.model]
    for slot in same_file:
        if set(slot.entry.aliases) & set(entry.aliases):
            return slot
    return same_file[0] if len(same_file) == 1 else None
