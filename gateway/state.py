"""The gateway's state on its Starlette app: one typed object, not attributes found by name.

    create_app   GatewayState(config, metrics, started) as app.state.gateway
    lifespan     .running = Running(registry, router, reloader, watcher) before they start;
                 .startup_error when pinned models fail to load; .stopping on the way out
    reloads      .config replaced whole (watch.Reloader's on_applied)
    shutdown     .stopping from the first SIGINT/SIGTERM (/health answers 503 from then on)

Handlers, middleware and the CLI reach it with `app_state(app)` (a request: `request.app`, a
middleware: `scope["app"]`). `registry`, `router`, `reloader` and `watcher` exist only while the lifespan
runs, as requests do; `running` is None before start-up and says so to code that may run then
(a signal handler, the shutdown drain).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.applications import Starlette

if TYPE_CHECKING:
    from gateway.api.response_store import ResponseStore
    from gateway.config import Config
    from gateway.fleet.registry import Registry
    from gateway.fleet.router import Router
    from gateway.fleet.watch import ConfigWatcher, Reloader
    from gateway.fleet.zeroconf import ModelsDirWatcher
    from gateway.metrics import Metrics


@dataclass(eq=False)
class Running:
    """What the lifespan starts, for as long as it runs."""

    registry: Registry
    router: Router                    # the registry and the upstream servers beside it
    reloader: Reloader
    watcher: ConfigWatcher | ModelsDirWatcher | None  # None: no --watch (or nothing to watch)


@dataclass(eq=False)
class GatewayState:
    config: Config                    # the config in force: a reload swaps it whole
    metrics: Metrics
    started: int                      # unix time the app was made (/v1/models' `created`)
    stopping: bool = False            # shutdown began: /health answers 503
    startup_error: str | None = None  # why start-up failed (`modelyard serve` prints it)
    running: Running | None = None    # set by the lifespan
    responses: ResponseStore | None = None  # previous_response_id's store, made on first use

    @property
    def registry(self) -> Registry:
        return self._running().registry

    @property
    def router(self) -> Router:
        return self._running().router

    @property
    def reloader(self) -> Reloader:
        return self._running().reloader

    @property
    def watcher(self) -> ConfigWatcher | ModelsDirWatcher | None:
        return self._running().watcher

    def _running(self) -> Running:
        if self.running is None:
            raise RuntimeError("the gateway is not running (its lifespan has not started)")
        return self.running


def app_state(app: Starlette) -> GatewayState:
    """The state create_app put on `app` (Starlette types app.state's attributes as Any)."""
    state: GatewayState = app.state.gateway
    return state
