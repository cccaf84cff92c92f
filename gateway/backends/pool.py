"""A pool: the members serving one alias, which one takes the next request, and the one retry.

Picking and counting happen on the event loop with no `await` between the choice and the
in-flight increment, so concurrent requests see each other's choices (least_busy spreads a burst
evenly). Healthy members below their max_concurrent are preferred; when every member is unhealthy
the pool tries them anyway (a certain error helps nobody). A request that failed before any byte
reached the client is retried once, on another usable member; never after bytes were sent.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence

from starlette.responses import Response

from gateway.backends.base import (
    BACKEND_HEADER,
    Backend,
    BackendKind,
    Call,
    Measured,
    Retryable,
    Tracked,
    now,
)
from gateway.backends.health import Failure, Health, Stats
from gateway.config.upstream import Balance
from gateway.errors import APIError
from gateway.fleet.registry.errors import RegistryBusyError
from gateway.generation.events import QueueFullError

log = logging.getLogger("modelyard.upstream")

ATTEMPTS = 2  # the first try and one retry


class LocalBackend(Measured):
    """A local entry as a pool member: the route's own local path, under the pool's alias."""

    kind: BackendKind = "local"
    max_concurrent: int | None = None

    def __init__(self, alias: str) -> None:
        super().__init__(Health(cooldown=0.0, probing=False))  # the registry keeps its own state
        self.alias = alias

    @property
    def label(self) -> str:
        return f"local:{self.alias}"

    async def serve(self, call: Call) -> Response:
        try:
            response = await call.local(call.request, call.body, self.alias, call.alias)
        except (RegistryBusyError, QueueFullError) as e:  # before any byte: another may serve
            self.stats.error(Failure.STATUS)
            raise Retryable(APIError(503, f"{self.label}: {e}", type="server_error",
                                     code="server_busy"), Failure.STATUS) from None
        response.headers[BACKEND_HEADER] = self.label
        return response


class Pool:
    """The members of one alias and how to balance them."""

    def __init__(self, alias: str, members: Sequence[Backend], balance: Balance,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.alias = alias
        self.members = list(members)
        self.balance = balance
        self._turn = itertools.count()
        self._freed = asyncio.Event()
        self._on_change = on_change  # the registry's: shutdown waits for in-flight requests

    def pick(self, exclude: Sequence[Backend] = (), *, fail_open: bool = True) -> Backend | None:
        """The member for the next request, or None when every candidate is at max_concurrent
        (or, with fail_open False, when no untried member is healthy)."""
        t = now()
        candidates = [m for m in self.members if m not in exclude]
        healthy = [m for m in candidates if m.health.usable(t)]
        if healthy or not fail_open:  # a healthy member that is full is waited for
            candidates = healthy
        room = [m for m in candidates
                if m.max_concurrent is None or m.stats.in_flight < m.max_concurrent]
        if not room:
            return None
        turn = next(self._turn)
        rotated = room[turn % len(room):] + room[:turn % len(room)]  # ties go round the pool
        if self.balance == "round_robin":
            return rotated[0]
        return min(rotated, key=lambda m: m.stats.in_flight)

    async def serve(self, call: Call, wait: float) -> Response:
        """Serve `call` on a member, retrying once on another before any byte was sent."""
        tried: list[Backend] = []
        error: APIError | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while len(tried) < ATTEMPTS:
            member = self.pick(tried, fail_open=not tried)
            if member is None and tried:
                break  # no other usable member: the first error stands
            if member is None:  # every member at max_concurrent: wait for a free one
                if loop.time() >= deadline:
                    raise RegistryBusyError(f"every server of {self.alias} is at its "
                                            "max_concurrent")
                await _wait(self._freed, deadline - loop.time())
                continue
            tried.append(member)
            try:
                return self._track(member, await self._serve_on(member, call))
            except Retryable as e:
                error = e.error
                log.warning("%s: %s%s", self.alias, e.error.message,
                            "; retrying on another" if len(tried) < ATTEMPTS else "")
        assert error is not None
        raise error

    async def _serve_on(self, member: Backend, call: Call) -> Response:
        member.stats.in_flight += 1
        member.stats.requests += 1
        self._on_change()
        try:
            return await member.serve(call)
        except BaseException:
            self._release(member)
            raise

    def _track(self, member: Backend, response: Response) -> Response:
        return Tracked(response, lambda: self._release(member))

    def _release(self, member: Backend) -> None:
        member.stats.in_flight -= 1
        self._freed.set()
        self._freed = asyncio.Event()
        self._on_change()


async def _wait(event: asyncio.Event, timeout: float) -> None:
    try:
        async with asyncio.timeout(max(0.0, timeout)):
            await event.wait()
    except TimeoutError:
        pass


def usable_count(members: Sequence[Backend]) -> int:
    t = now()
    return sum(m.health.usable(t) for m in members)


__all__ = ["LocalBackend", "Pool", "Stats", "usable_count"]
