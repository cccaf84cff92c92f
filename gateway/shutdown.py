"""Stopping on SIGTERM/SIGINT: drain for `shutdown_timeout`, then stop the listener.

    SERVING --first signal--> DRAINING --nothing in flight, or the deadline--> STOPPING
                                 |          (at the deadline running requests, relayed
                                 |           upstream streams too, end with an error event
                                 |           and [DONE])
                                 +--second signal--> STOPPING (running requests end at once)

While DRAINING the listener stays open: /health answers 503 `stopping` (a load balancer takes
the server out), new generation requests get 503 with Retry-After (the registry refuses them),
and running ones, streams included, go on to their end. The log says every few seconds what is
still running. STOPPING sets the trigger Hypercorn waits on: it closes the listener and the
lifespan unloads the models.
"""
from __future__ import annotations

import asyncio
import enum
import logging
from typing import TYPE_CHECKING

from starlette.applications import Starlette

from gateway.generation.events import ServerStoppingError
from gateway.state import app_state

if TYPE_CHECKING:
    from gateway.fleet.router import Router

log = logging.getLogger("modelyard")

PROGRESS_SECONDS = 5.0   # how often the log says what the drain waits for
ABORT_GRACE_SECONDS = 5.0  # after aborting, how long the ended streams get to send their end


class Phase(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    STOPPING = "stopping"


class Shutdown:
    """The drain for one app; `signal()` from the signal handler, `wait()` for Hypercorn."""

    def __init__(self, app: Starlette, timeout: float) -> None:
        self.app = app
        self.timeout = timeout
        self.phase = Phase.SERVING
        self._stop = asyncio.Event()
        self._drain: asyncio.Task[None] | None = None

    async def wait(self) -> None:
        """Hypercorn's shutdown trigger: returns once the listener should close."""
        await self._stop.wait()

    def signal(self, name: str) -> None:
        if self.phase is Phase.SERVING:
            self.phase = Phase.DRAINING
            state = app_state(self.app)
            self.timeout = state.config.shutdown_timeout  # a reload may have changed it
            state.stopping = True  # /health answers 503 from now on
            if state.running is not None:
                state.running.registry.stop_accepting()
            log.info("%s: stopping; running requests have up to %gs to finish (signal again "
                     "to stop now)", name, self.timeout)
            self._drain = asyncio.get_running_loop().create_task(self._run_drain(),
                                                                 name="modelyard-drain")
        elif self.phase is Phase.DRAINING:
            log.warning("%s again: stopping now", name)
            self._abort_and_stop()

    async def _run_drain(self) -> None:
        running = app_state(self.app).running
        router = running.router if running is not None else None  # local models and upstreams
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while router is not None and self.phase is Phase.DRAINING:
            busy = router.in_flight()
            remaining = deadline - loop.time()
            if not busy:
                log.info("stopping: no request is running")
                break
            if remaining <= 0:
                log.warning("stopping: shutdown_timeout (%gs) reached with %s still running; "
                            "ending them", self.timeout, _describe(busy))
                await self._abort(router)
                break
            log.info("stopping: waiting for %s (%.0fs left)", _describe(busy), remaining)
            await router.wait_idle(min(PROGRESS_SECONDS, remaining))
        self.phase = Phase.STOPPING
        self._stop.set()

    def _abort_and_stop(self) -> None:
        self.phase = Phase.STOPPING
        running = app_state(self.app).running
        if running is not None:
            running.router.abort_running(ServerStoppingError(self.timeout))
        self._stop.set()

    async def _abort(self, router: Router) -> None:
        router.abort_running(ServerStoppingError(self.timeout))
        await router.wait_idle(ABORT_GRACE_SECONDS)


def _describe(busy: dict[str, int]) -> str:
    total = sum(busy.values())
    per_model = ", ".join(f"{name}: {n}" for name, n in busy.items())
    return f"{total} request{'s' if total != 1 else ''} ({per_model})"
