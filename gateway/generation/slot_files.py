"""What llama.cpp's slot actions need of a model: its idle slots saved to, restored from and
erased (gateway/api/slots.py asks; gateway/local/served_model.py's ServedModel does it).

A model behind another server has no such slots: it does not meet `SlotFiles`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable


class SlotBusyError(Exception):
    """The slot is processing a request: the action waits for it (as llama.cpp defers it)."""

    def __init__(self, slot: int) -> None:
        super().__init__(f"slot {slot} is processing a request")


class SlotActionError(Exception):
    """The slot cannot be saved, or the file cannot be restored (a 400; the message says why)."""


@runtime_checkable
class SlotFiles(Protocol):
    def slot_file(self, action: str, slot: int, path: Path | None) -> tuple[int, int]: ...
