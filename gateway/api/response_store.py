"""The responses kept for `previous_response_id`: in memory, bounded by count, bytes and age.

Each stored response is the conversation it ends, as Responses input items (the history it was
given, its own input, its output), so a follow-up's prompt is that history plus its new input.
The bounds come from the config's `responses` section at every call (they are live): the
oldest entries go first when a bound is passed, and an entry older than `store_ttl` is gone.
A response the store no longer has is a 404 for the follow-up, never a silently shorter prompt;
with `store_entries: 0` the server is stateless and says so (a 400).
"""
from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.config import ResponsesSettings
from gateway.errors import APIError, invalid_request


@dataclass(frozen=True)
class Stored:
    items: list[dict[str, Any]]  # the whole conversation up to and with this response's output
    size: int                    # its bytes as JSON (what store_bytes counts)
    at: float                    # when it was stored (monotonic seconds)


class ResponseStore:
    def __init__(self, settings: Callable[[], ResponsesSettings],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._entries: OrderedDict[str, Stored] = OrderedDict()  # oldest first
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, response_id: str, items: list[dict[str, Any]]) -> None:
        settings = self._settings()
        size = len(json.dumps(items, ensure_ascii=False).encode())
        if settings.store_entries == 0 or size > settings.store_bytes:
            return  # stateless, or larger than the whole store: a follow-up gets a 404
        self._entries[response_id] = Stored(items, size, self._clock())
        self._bytes += size
        self._trim(settings)

    def history(self, response_id: str) -> list[dict[str, Any]]:
        """The conversation `response_id` ended; a 400 when the server keeps none, a 404 when
        this one is not (or no longer) kept."""
        settings = self._settings()
        if settings.store_entries == 0:
            raise invalid_request(
                "previous_response_id is not supported: this server is stateless "
                "(responses.store_entries is 0); send the whole conversation in 'input'",
                "previous_response_id")
        self._trim(settings)
        stored = self._entries.get(response_id)
        if stored is None:
            raise APIError(404, f"Previous response with id '{response_id}' not found (it was "
                                "never stored, or the store evicted it: responses.store_entries, "
                                "store_bytes, store_ttl); send the whole conversation in 'input'",
                           param="previous_response_id", code="previous_response_not_found")
        return list(stored.items)

    def _trim(self, settings: ResponsesSettings) -> None:
        oldest_kept = self._clock() - settings.store_ttl
        while self._entries:
            first = next(iter(self._entries.values()))
            if (len(self._entries) <= settings.store_entries
                    and self._bytes <= settings.store_bytes and first.at >= oldest_kept):
                break
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.size
