"""The ASGI application: routes, error handlers, request log and metrics, and the lifespan that
runs the registry, the config reloader and the file watcher."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from gateway.api import admin, anthropic, console, embedding_routes, events, forward
from gateway.api import llama as llama_api
from gateway.api import ollama as ollama_api
from gateway.api import responses as responses_api
from gateway.api.openai import routes
from gateway.backends.metrics import UpstreamCollector
from gateway.config import Config
from gateway.errors import HANDLED, handle_exception
from gateway.fleet.registry import PinnedLoadError, Registry
from gateway.fleet.router import Router
from gateway.fleet.watch import ConfigWatcher, Reloader, WatchOptions
from gateway.fleet.zeroconf import ModelsDirWatcher
from gateway.http.asgi import HttpMiddleware, StatusNotingSend
from gateway.http.auth import AuthMiddleware
from gateway.http.cors import ConfigCors
from gateway.http.limits import BodyLimits
from gateway.local.served_model import ServedModel, load_served_model
from gateway.metrics import NO_MODEL, Metrics, loader_with_metrics
from gateway.state import GatewayState, Running, app_state

access_log = logging.getLogger("modelyard.access")
log = logging.getLogger("modelyard")


class RequestLog(HttpMiddleware):
    """One log line per HTTP request: method, path, status, duration (also for streams), model;
    and the same request counted in the app's metrics."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        noting = StatusNotingSend(send)
        try:
            await self.app(scope, receive, noting)
        finally:
            client = scope.get("client") or ("-", 0)
            seconds = time.perf_counter() - start
            # routes note the alias a request was served under (request.state.model)
            model = (scope.get("state") or {}).get("model") or NO_MODEL
            access_log.info("%s %s %s %s %.0fms %s", client[0], scope["method"], scope["path"],
                            noting.status or "-", seconds * 1000, model)
            route = scope.get("route")  # the matched route: its template keeps series bounded
            endpoint = getattr(route, "path", None) or "unmatched"
            if "app" in scope:
                app_state(scope["app"]).metrics.request(model, endpoint, noting.status or 500,
                                                        seconds)


def create_app(config: Config, *, loader: Callable[..., ServedModel] = load_served_model,
               config_path: Path | None = None, watch: WatchOptions | None = None,
               load: Callable[[Path], Config] | None = None) -> Starlette:
    """The gateway for `config`. Models load lazily on first use (or at start-up if pinned).

    `config_path` is the file to reload from (default: the file `config` was read from);
    POST /admin/reload and SIGHUP reload it. With `watch` enabled, saving it reloads too.
    `load` reads it (default load_config; a models folder passes a rescan, gateway/fleet/zeroconf.py).
    """
    metrics = Metrics()
    path = config_path if config_path is not None else config.source
    watch = watch or WatchOptions(enabled=False)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        registry = Registry(config, loader=loader_with_metrics(loader, metrics), metrics=metrics)
        metrics.watch_models(registry.snapshot)
        router = Router(registry)
        metrics.registry.register(UpstreamCollector(router.upstream_rows))

        def applied(new: Config) -> None:
            state.config = new

        reloader = Reloader(router, path, metrics=metrics, load=load, on_applied=applied)
        watcher: ConfigWatcher | ModelsDirWatcher | None = None
        if watch.enabled and path is not None:
            watcher = (ModelsDirWatcher(reloader, watch) if watch.models_dir
                       else ConfigWatcher(reloader, watch))
        state.running = Running(registry, router, reloader, watcher)
        try:
            await router.start()
        except PinnedLoadError as exc:
            state.startup_error = str(exc)  # what `modelyard serve` prints before exiting 2
            await router.close()
            raise
        tasks = [asyncio.create_task(reloader.run(), name="modelyard-reloader")]
        if watcher is not None:
            tasks.append(asyncio.create_task(watcher.run(), name="modelyard-watcher"))
        try:
            yield
        finally:
            state.stopping = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await router.close()

    app = Starlette(
        routes=(routes() + anthropic.routes() + admin.routes() + llama_api.routes()
                + ollama_api.routes() + embedding_routes.routes() + events.routes()
                + responses_api.routes()
                + console.routes(other=ollama_api.running)  # GET /: the page or Ollama's answer
                + forward.routes()),  # last: only what no route above serves
        lifespan=lifespan,
        exception_handlers=dict.fromkeys(HANDLED, handle_exception),
    )
    state = app.state.gateway = GatewayState(config, metrics, started=int(time.time()))
    # outermost first: the request log sees everything (what BodyLimits refuses too), CORS
    # answers preflights before keys; a body over the limit is refused before anything reads it
    app.add_middleware(BodyLimits)
    app.add_middleware(AuthMiddleware)
    app.add_middleware(ConfigCors)
    app.add_middleware(RequestLog)
    return app
