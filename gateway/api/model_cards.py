"""Model objects for `GET /v1/models` and `GET /v1/models/{id}`: OpenAI's fields, plus a fenced
`modelyard` field with what the registry knows (state) and the file's header says (architecture,
quantization, context). llama.cpp's router adds `status` to the objects of unprefixed `/models`.

Nothing here loads a model: headers are read once per file (gateway/api/model_info.py), in a thread.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gateway import protocol as p
from gateway.api import model_info
from gateway.config import Config, ModelEntry, ModelNotFoundError

if TYPE_CHECKING:
    from gateway.fleet.registry import ModelRow

# registry states -> llama.cpp router's status values
_ROUTER_STATUS = {"unloaded": "unloaded", "loading": "loading", "ready": "loaded",
                  "draining": "unloaded", "failed": "unloaded"}


def _states(rows: Iterable[ModelRow]) -> dict[str, ModelRow]:
    """The live (not retiring) registry row of each model file."""
    return {row["model"]: row for row in rows if not row["retiring"]}


async def cards(config: Config, rows: Sequence[ModelRow], created: int,
                aliases: Iterable[str] | None = None) -> list[p.ModelCard]:
    """One object per alias (all, or those in `aliases`), in config order."""
    wanted = None if aliases is None else set(aliases)
    states = _states(rows)
    entries = {str(e.model): e for e in config.models}
    facts = dict(zip(entries, await asyncio.gather(
        *(asyncio.to_thread(model_info.facts, path) for path in entries))))
    out = []
    for entry in config.models:
        row = states.get(str(entry.model))
        extras = _extras(entry, row, facts[str(entry.model)])
        out += [p.ModelCard(id=alias, created=created, modelyard=extras) for alias in entry.aliases
                if wanted is None or alias in wanted]
    return out


async def card(config: Config, rows: Sequence[ModelRow], created: int, alias: str) -> p.ModelCard:
    """The object of one alias; ModelNotFoundError (404 model_not_found) if none answers to it."""
    config.resolve(alias)  # raises for an unknown alias
    found = await cards(config, rows, created, [alias])
    if not found:
        raise ModelNotFoundError(alias, config.aliases())
    return found[0]


def _extras(entry: ModelEntry, row: ModelRow | None, facts: model_info.ModelFacts) -> p.ModelExtras:
    state = "unloaded" if row is None else row["state"]
    return p.ModelExtras(aliases=list(entry.aliases), state=state, loaded=state == "ready",
                         context_length=entry.n_ctx, n_ctx_train=facts.n_ctx_train,
                         architecture=facts.architecture, quantization=facts.quantization,
                         parameters=facts.n_params, images=entry.mmproj is not None,
                         capabilities=facts.capabilities(entry.pooling))


def router_status(card: p.ModelCard) -> dict[str, Any]:
    """llama.cpp's router `status` object for a card: {"value": "loaded"} and so on."""
    state = card.modelyard.state if card.modelyard else "unloaded"
    status: dict[str, Any] = {"value": _ROUTER_STATUS.get(state, "unloaded")}
    if state == "failed":
        status["failed"] = True
    return status
