"""Sampling defaults: what a request gets for every sampling field it leaves out.

OpenAI's defaults (temperature 1, top_p 1, no top_k/min_p, no chat max_tokens) suit large hosted
models; small local ones ramble under them and a chat without `max_tokens` could run to the end
of the context. So a field the request does not send is filled from, in this order:

    the config entry (or `defaults:`)  ->  the GGUF's `general.sampling.*` metadata
    ->  llama.cpp's defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05)

A value the request sends always wins, even when it equals OpenAI's default. `max_tokens` comes
from the entry too; without one, chat gets CHAT_MAX_TOKENS (at most half the context, so a
generation nobody bounded cannot fill it) and the legacy completions endpoint OpenAI's 16. An
entry's `seed` (llama-server's --seed) seeds requests that bring none.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gateway.config import ModelEntry

CHAT_MAX_TOKENS = 1024        # chat's default budget, capped at n_ctx // 2
COMPLETION_MAX_TOKENS = 16    # OpenAI's documented default for /v1/completions


@dataclass(frozen=True)
class Sampling:
    """Sampling settings; None means "not set at this level"."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def over(self, below: Sampling) -> Sampling:
        """These values where set, `below`'s elsewhere."""
        return replace(below, **{f.name: v for f in fields(self)
                                 if (v := getattr(self, f.name)) is not None})

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


SAMPLING_FIELDS = tuple(f.name for f in fields(Sampling))

LLAMA_CPP = Sampling(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
                     presence_penalty=0.0, frequency_penalty=0.0)

# general.sampling.* keys (gguf-py's Keys.General.SAMPLING_*) -> our field names
GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repeat_penalty",
}
_VALID = {  # a GGUF value outside these ranges is ignored (files are not always right)
    "temperature": (0.0, 2.0), "top_k": (0, 1 << 20), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
    "repeat_penalty": (1e-6, 10.0),
}


def from_metadata(metadata: Mapping[str, Any]) -> Sampling:
    """The sampling settings a GGUF recommends, from its general.sampling.* keys."""
    found: dict[str, Any] = {}
    for key, name in GGUF_KEYS.items():
        value = metadata.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        low, high = _VALID[name]
        if low <= value <= high:
            found[name] = int(value) if name == "top_k" else float(value)
    return Sampling(**found)


def from_entry(entry: ModelEntry) -> Sampling:
    return Sampling(**{name: getattr(entry, name) for name in SAMPLING_FIELDS})


def effective(entry: ModelEntry, model_defaults: Sampling) -> Sampling:
    """Every field set: the entry's, else the model file's, else llama.cpp's."""
    return from_entry(entry).over(model_defaults.over(LLAMA_CPP))


def chat_max_tokens(entry: ModelEntry, n_ctx: int) -> int:
    if entry.max_tokens is not None:
        return entry.max_tokens
    return max(1, min(CHAT_MAX_TOKENS, n_ctx // 2))


def completion_max_tokens(entry: ModelEntry) -> int:
    return entry.max_tokens if entry.max_tokens is not None else COMPLETION_MAX_TOKENS


R = TypeVar("R")


def fill(req: R, entry: ModelEntry, model_defaults: Sampling, max_tokens: int) -> R:
    """`req` with every sampling field it did not send filled in (a pydantic request model).

    `max_tokens` is the budget to use when the request sets none (it has a `token_budget()`).
    """
    sent = req.model_fields_set  # type: ignore[attr-defined]
    values = effective(entry, model_defaults).as_dict()
    update = {k: v for k, v in values.items() if k not in sent and hasattr(req, k)}
    if req.token_budget() is None or ("max_tokens" not in sent  # type: ignore[attr-defined]
                                      and "max_completion_tokens" not in sent):
        update["max_tokens"] = max_tokens
    if getattr(req, "seed", None) is None and entry.seed is not None:
        update["seed"] = entry.seed  # the entry's seed makes unseeded requests repeatable
    return req.model_copy(update=update)  # type: ignore[attr-defined,no-any-return]
