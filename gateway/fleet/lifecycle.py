"""The life of one configured model, as states and the transitions allowed between them.

The registry is the only writer: it calls `advance()` for every change, so an impossible step
(say, READY -> LOADING) fails loudly instead of leaving a slot in a state nobody expects.

              acquire(), or start() for a pinned model
    +----------+ ------------------------------------> +---------+  loader raised   +--------+
    | UNLOADED |                                       | LOADING | ---------------> | FAILED |
    +----------+ <-----------+                         +---------+ <--------------- +--------+
         ^                   |                              |      next acquire()    | ^ keeps
         |                   +----------------------------- | ---------------------- + | last_error
         |                 entry removed (apply), close()   | loaded                   |
         |                                                  v                          |
         |  nothing in flight:  +----------+  LRU eviction, +-------+                  |
         +--------------------- | DRAINING | <------------- | READY |  <- the only state that serves
            model.close(), gc   +----------+  idle timeout, +-------+
                                     |        apply(), admin unload, close(),
                                     |        broken (file changed, non-finite logits)
                                     +-------------------------------------------------+
                                       broken: once closed, FAILED with the reason

acquire() counts a request in flight only in READY. DRAINING takes no new requests; the requests
already running finish, then the model is closed and every reference to it dropped, so its memory
goes back to the system.
"""
from __future__ import annotations

import enum


class ModelState(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    ModelState.UNLOADED: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset({ModelState.READY, ModelState.FAILED}),
    ModelState.READY: frozenset({ModelState.DRAINING}),
    ModelState.DRAINING: frozenset({ModelState.UNLOADED, ModelState.FAILED}),
    ModelState.FAILED: frozenset({ModelState.LOADING, ModelState.UNLOADED}),
}

# States whose model holds (or is about to hold) memory: they count against the registry limits.
RESIDENT_STATES = frozenset({ModelState.LOADING, ModelState.READY, ModelState.DRAINING})


class InvalidTransition(RuntimeError):
    """A bug in the registry: it tried a step the diagram above does not have."""


def advance(current: ModelState, target: ModelState) -> ModelState:
    """Return `target` when current -> target is an edge of the diagram, else raise."""
    if target not in TRANSITIONS[current]:
        raise InvalidTransition(f"model state cannot go from {current.value} to {target.value}")
    return target
