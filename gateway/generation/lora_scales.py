"""An entry's LoRA adapter scales as llama-server serves them: global, and per request.

    global     starts at the entry's `lora` scales (what the load merged); POST /lora-adapters
               sets it ([{id, scale}]: an adapter not listed gets 0, as llama-server's
               construct_lora_list); a reload of the model starts over from the config
    a request  `lora: [{id, scale}]` on /completion and chat: the scales for it alone (again,
               an adapter not listed gets 0); without the field, the global ones

A sequence at other scales than the merged ones runs the adapters' difference as a side path
(engine/lora_side.py); an id the entry does not have is a 400 naming `lora`.
"""
from __future__ import annotations

from collections.abc import Iterable

from gateway.errors import invalid_request


class LoraScales:
    def __init__(self, merged: Iterable[float]) -> None:
        self.merged = tuple(float(s) for s in merged)  # what the load merged (engine order)
        self.global_scales = self.merged

    def resolve(self, asked: Iterable[tuple[int, float]] | None) -> tuple[float, ...]:
        """The scale of every adapter for a request's `lora` entries (None: the global ones)."""
        if asked is None:
            return self.global_scales
        scales = [0.0] * len(self.merged)
        for i, scale in asked:
            if not 0 <= i < len(scales):
                raise invalid_request(f"lora: adapter id {i} is not one of this model's "
                                      f"{len(scales)} adapters (GET /lora-adapters lists them)",
                                      "lora")
            scales[i] = float(scale)
        return tuple(scales)

    def set_global(self, asked: Iterable[tuple[int, float]]) -> None:
        self.global_scales = self.resolve(list(asked))

    def for_engine(self, asked: Iterable[tuple[int, float]] | None) -> tuple[float, ...] | None:
        """What a Sequence carries: the scales, or None when they are the merged ones."""
        scales = self.resolve(asked)
        return None if scales == self.merged else scales
