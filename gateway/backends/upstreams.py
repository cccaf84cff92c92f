"""Every upstream server of the config: the pools of each alias, the probe, discovery, reloads.

A server is one `UpstreamBackend` however many entries list it (the same URL, key and settings):
one health, one in-flight count, one connection pool. A reload keeps the backends whose settings
did not change (their health, counts and connections too), builds the new ones, and retires the
rest: a retired backend serves the requests it already has (their pool holds it) and is closed
once they are done.

The probe runs every `probe.interval` per server (the shortest, when entries disagree): it keeps
the health (gateway/backends/health.py) and, for `discover: true`, the aliases the server lists;
those aliases become pools of their own (configured aliases win over discovered ones).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Literal, TypedDict

from gateway.backends.base import Backend
from gateway.backends.pool import LocalBackend, Pool
from gateway.backends.upstream import UpstreamBackend
from gateway.config.upstream import LocalMember, ProbeSettings, UpstreamEntry
from gateway.errors import APIError

log = logging.getLogger("modelyard.upstream")

PROBE_TICK = 1.0  # the loop wakes at least this often (a reload may bring shorter intervals)


class UpstreamRow(TypedDict):
    """An upstream server as /admin/models and /metrics see it."""

    kind: Literal["upstream"]
    name: str                      # its label: the configured name or host:port/path
    url: str
    aliases: list[str]             # the configured aliases it serves
    discovered: list[str]          # what it lists, with discover: true
    state: str                     # healthy | unhealthy
    since: float | None            # unix time of the last change of state
    last_error: str | None
    in_flight: int
    max_concurrent: int | None
    requests: int
    errors: dict[str, int]         # by kind: connect, timeout, status, stream, probe
    first_byte_seconds_sum: float  # over `answered` requests: the mean latency to a first byte
    answered: int
    retiring: bool


Identity = tuple[object, ...]


class Upstreams:
    """The upstream side of the registry; all of it runs on the event loop."""

    def __init__(self, entries: list[UpstreamEntry], on_change: Callable[[], None]) -> None:
        self._on_change = on_change
        self._backends: dict[Identity, UpstreamBackend] = {}
        self._locals: dict[str, LocalBackend] = {}
        self._probe: dict[Identity, ProbeSettings] = {}
        self._aliases: dict[Identity, list[str]] = {}
        self._pools: dict[str, Pool] = {}
        self._found: dict[str, Pool] = {}  # discovered aliases
        self._retired: list[UpstreamBackend] = []
        self._next_probe: dict[Identity, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._build(entries)

    # -- routing -------------------------------------------------------------------------------

    def route(self, alias: str) -> Pool | None:
        return self._pools.get(alias) or self._found.get(alias)

    def configured(self) -> bool:
        return bool(self._pools) or bool(self._backends)

    def discovered_aliases(self) -> list[str]:
        return list(self._found)

    def in_flight(self) -> dict[str, int]:
        busy: list[Backend] = [*self._backends.values(), *self._retired, *self._locals.values()]
        return {b.label: b.stats.in_flight for b in busy if b.stats.in_flight}

    def abort_relays(self, error: APIError) -> None:
        """End every stream relayed from any server (retiring ones too) with `error`."""
        for backend in [*self._backends.values(), *self._retired]:
            backend.abort_relays(error)

    # -- start, reload, stop -------------------------------------------------------------------

    async def start(self) -> None:
        """Probe every server once (so discovered aliases are listed from the start), then keep
        probing in the background."""
        await self._probe_due(force=True)
        self._task = asyncio.create_task(self._probe_loop(), name="modelyard-upstream-probe")

    def apply(self, entries: list[UpstreamEntry]) -> None:
        old = self._backends
        self._build(entries, old)
        for key, backend in old.items():
            if key not in self._backends:
                self._retire(backend)
        if self._task is not None:  # new servers: probed on the next tick
            for key in self._backends:
                self._next_probe.setdefault(key, 0.0)
        self._on_change()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for backend in [*self._backends.values(), *self._retired]:
            await backend.close()
        await asyncio.gather(*self._closing, return_exceptions=True)

    def _build(self, entries: list[UpstreamEntry],
               old: dict[Identity, UpstreamBackend] | None = None) -> None:
        backends: dict[Identity, UpstreamBackend] = {}
        probe: dict[Identity, ProbeSettings] = {}
        served: dict[Identity, list[str]] = {}
        pools: dict[str, Pool] = {}
        for entry in entries:
            members: list[Backend] = []
            for member in entry.upstream:
                if isinstance(member, LocalMember):
                    local = self._locals.get(member.local) or LocalBackend(member.local)
                    self._locals[member.local] = local
                    members.append(local)
                    continue
                key = member.identity()
                backend = backends.get(key) or (old or {}).get(key)
                if backend is None:
                    backend = UpstreamBackend(member, cooldown=entry.probe.cooldown,
                                              probing=entry.probe.interval > 0)
                backends[key] = backend
                shorter = probe.get(key)
                if shorter is None or 0 < entry.probe.interval < shorter.interval:
                    probe[key] = entry.probe
                served.setdefault(key, []).extend(entry.aliases)
                members.append(backend)
            for alias in entry.aliases:
                pools[alias] = Pool(alias, members, entry.balance, self._on_change)
        self._backends, self._probe, self._aliases, self._pools = backends, probe, served, pools
        self._rediscover()

    def _retire(self, backend: UpstreamBackend) -> None:
        backend.retired = True
        self._retired.append(backend)
        task = asyncio.get_running_loop().create_task(self._close_when_idle(backend))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_when_idle(self, backend: UpstreamBackend) -> None:
        while backend.stats.in_flight:  # in-flight requests finish on the old backend
            await asyncio.sleep(0.1)
        await backend.close()
        self._retired.remove(backend)
        self._on_change()

    # -- probing ------------------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        while True:
            await self._probe_due()
            await asyncio.sleep(PROBE_TICK if not self._next_probe else
                                max(0.05, min(PROBE_TICK, min(self._next_probe.values())
                                              - time.monotonic())))

    async def _probe_due(self, force: bool = False) -> None:
        t = time.monotonic()
        due = [(k, b) for k, b in self._backends.items()
               if force or (self._probe[k].interval > 0 and self._next_probe.get(k, 0.0) <= t)]
        if not due:
            return
        await asyncio.gather(*(b.probe(self._probe[k].path, self._probe[k].timeout)
                               for k, b in due))
        for k, _ in due:
            interval = self._probe[k].interval if k in self._probe else 0.0
            self._next_probe[k] = t + interval if interval > 0 else float("inf")
        self._rediscover()
        self._on_change()

    def _rediscover(self) -> None:
        """Pools for the aliases discovering servers list, not shadowed by configured ones."""
        found: dict[str, list[Backend]] = {}
        for backend in self._backends.values():
            for alias in backend.discovered:
                if alias not in self._pools:
                    found.setdefault(alias, []).append(backend)
        current = {a: p for a, p in self._found.items()
                   if a in found and p.members == found[a]}
        self._found = {a: current.get(a) or Pool(a, members, "least_busy", self._on_change)
                       for a, members in found.items()}

    # -- reporting -----------------------------------------------------------------------------

    def rows(self) -> list[UpstreamRow]:
        out = []
        for key, backend in [*self._backends.items(), *((b.server.identity(), b)
                                                         for b in self._retired)]:
            h, s = backend.health, backend.stats
            out.append(UpstreamRow(
                kind="upstream", name=backend.label, url=backend.server.url,
                aliases=[] if backend.retired else list(self._aliases.get(key, [])),
                discovered=list(backend.discovered), state=h.state.value,
                since=None if h.since == 0.0 else time.time() - (time.monotonic() - h.since),
                last_error=h.last_error, in_flight=s.in_flight,
                max_concurrent=backend.max_concurrent, requests=s.requests,
                errors={kind.value: n for kind, n in s.errors.items()},
                first_byte_seconds_sum=s.first_byte_seconds, answered=s.answered,
                retiring=backend.retired))
        return out

