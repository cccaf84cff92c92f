"""The router: which side serves an alias, the local registry or an upstream pool.

    route(alias)    -> None (the local path: registry.acquire) | the alias's Pool
    acquire(alias)  the registry's lease; its 404 also lists the aliases upstreams serve
    start/apply/close, in_flight/wait_idle, abort_running: both sides at once (the app,
                    reloads, shutdown)

The registry owns the local models' lives and knows nothing of upstream servers; the router
owns those (gateway/backends/upstreams.py) beside it, as llama-swap's router holds local
processes and remote peers as siblings. Both run on the event loop.
"""
from __future__ import annotations

from gateway.backends.pool import Pool
from gateway.backends.upstreams import UpstreamRow, Upstreams
from gateway.config import Config, ModelNotFoundError
from gateway.errors import to_api_error
from gateway.fleet.registry import ApplyResult, Lease, Registry, RegistryBusyError


class Router:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.upstreams = Upstreams(registry.config.upstreams, registry.notify)

    @property
    def config(self) -> Config:
        return self.registry.config

    @property
    def closed(self) -> bool:
        return self.registry.closed

    # -- routing ------------------------------------------------------------------------------

    def route(self, alias: str | None) -> Pool | None:
        """The pool serving `alias` (None: the default alias), or None for the local path (which
        answers 404 for an alias nobody serves). RegistryBusyError once shutdown began."""
        if not self.registry.accepting:
            raise RegistryBusyError("the server is shutting down")
        name = self.config.default_alias() if alias is None else alias
        if self.config.is_local(name, exact=True):
            return None
        return self.upstreams.route(name)  # None: a local glob alias, or nobody (the 404)

    async def acquire(self, alias: str | None) -> Lease:
        try:
            return await self.registry.acquire(alias)
        except ModelNotFoundError as e:  # the 404 lists what upstreams serve too
            raise ModelNotFoundError(e.alias, [*e.available,
                                               *self.upstreams.discovered_aliases()]) from None

    def discovered_aliases(self) -> list[str]:
        return self.upstreams.discovered_aliases()

    def upstream_rows(self) -> list[UpstreamRow]:
        """Per upstream server: health, in flight, counts (retiring servers too)."""
        return self.upstreams.rows()

    # -- start, reload, stop ------------------------------------------------------------------

    async def start(self) -> None:
        """Probe every upstream once (discovered aliases are listed from the start), then start
        the registry (PinnedLoadError when a pinned model cannot load)."""
        await self.upstreams.start()
        await self.registry.start()

    def apply(self, config: Config) -> ApplyResult:
        result = self.registry.apply(config)
        self.upstreams.apply(config.upstreams)
        return result

    async def close(self) -> None:
        await self.registry.close()
        await self.upstreams.close()

    def in_flight(self) -> dict[str, int]:
        """Requests holding each model (by entry name) or upstream server (by its label), for
        those that have any."""
        return {**self.registry.in_flight(), **self.upstreams.in_flight()}

    async def wait_idle(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until no request holds a model or a server."""
        return await self.registry.wait_until(lambda: not self.in_flight(), timeout)

    def abort_running(self, error: BaseException) -> None:
        """End every running request with `error` (the shutdown deadline): the local models'
        generations and the streams relayed from upstreams alike."""
        self.registry.abort_running(error)
        self.upstreams.abort_relays(to_api_error(error))
