"""The health of one upstream server, and what it has served: pure bookkeeping, no I/O.

Passive checks (what requests see) and the active probe (gateway/backends/upstreams.py) both
report here; the pool only reads `usable()`.

              request failed (connect, timeout, 502/503/504, stream cut)
              or the probe failed
    HEALTHY  ----------------------------------------------------------->  UNHEALTHY
       ^                                                                      |
       +--- the probe succeeded (or, with no probe, `cooldown` passed) -------+

A request that succeeds does not clear UNHEALTHY on its own: a pool with every member unhealthy
still sends requests (better a try than a certain error), and one lucky request must not bring
back a server the probe still finds down. Without a probe, the cooldown is the way back.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class HealthState(enum.Enum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class Failure(enum.Enum):
    """Why a request to an upstream failed: the `kind` label of its error count."""
    CONNECT = "connect"        # no connection (refused, reset, DNS)
    TIMEOUT = "timeout"        # no byte within `timeout`
    STATUS = "status"          # 502, 503 or 504 before any byte
    STREAM = "stream"          # the connection broke after bytes were sent
    PROBE = "probe"            # the active check failed


@dataclass
class Health:
    """One server's state machine (diagram above); times are monotonic seconds."""

    cooldown: float                       # used when `probing` is False
    probing: bool
    state: HealthState = HealthState.HEALTHY
    since: float = 0.0                    # when the state last changed
    last_error: str | None = None

    def usable(self, now: float) -> bool:
        if self.state is HealthState.HEALTHY:
            return True
        if not self.probing and now - self.since >= self.cooldown:
            self.state, self.since = HealthState.HEALTHY, now
            return True
        return False

    def failed(self, now: float, why: str) -> None:
        self.last_error = why
        if self.state is HealthState.HEALTHY:
            self.state, self.since = HealthState.UNHEALTHY, now

    def probe_ok(self, now: float) -> None:
        if self.state is HealthState.UNHEALTHY:
            self.state, self.since = HealthState.HEALTHY, now


@dataclass
class Stats:
    """What a backend served: counts for /admin/models and /metrics."""

    in_flight: int = 0
    requests: int = 0
    errors: dict[Failure, int] = field(default_factory=lambda: dict.fromkeys(Failure, 0))
    first_byte_seconds: float = 0.0       # summed over `answered`: mean latency to the first byte
    answered: int = 0

    def error(self, kind: Failure) -> None:
        self.errors[kind] += 1

    def first_byte(self, seconds: float) -> None:
        self.first_byte_seconds += seconds
        self.answered += 1
