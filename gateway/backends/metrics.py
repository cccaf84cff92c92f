"""Prometheus series of the upstream servers, read from the registry's rows at each scrape.

    modelyard_upstream_healthy{backend}                    1 healthy, 0 unhealthy
    modelyard_upstream_in_flight{backend}                  requests it is serving now
    modelyard_upstream_requests_total{backend}             requests sent to it
    modelyard_upstream_errors_total{backend,kind}          connect, timeout, status, stream, probe
    modelyard_upstream_first_byte_seconds{backend}         summary: latency to its first byte

`backend` is a server's label from the config (never its key), so series stay bounded.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from gateway.backends.upstreams import UpstreamRow


class UpstreamCollector(Collector):
    def __init__(self, rows: Callable[[], list[UpstreamRow]]) -> None:
        self._rows = rows

    def collect(self) -> Iterable[Metric]:
        rows = [r for r in self._rows() if not r["retiring"]]
        healthy = GaugeMetricFamily("modelyard_upstream_healthy", "1 while an upstream server "
                                    "is healthy, 0 while it is not", labels=["backend"])
        in_flight = GaugeMetricFamily("modelyard_upstream_in_flight", "Requests an upstream "
                                      "server is serving now", labels=["backend"])
        requests = CounterMetricFamily("modelyard_upstream_requests", "Requests sent to an "
                                       "upstream server", labels=["backend"])
        errors = CounterMetricFamily("modelyard_upstream_errors", "Failed requests and probes "
                                     "of an upstream server by kind", labels=["backend", "kind"])
        latency = SummaryMetricFamily("modelyard_upstream_first_byte_seconds", "Time from "
                                      "sending a request upstream to its first byte",
                                      labels=["backend"])
        for r in rows:
            name = r["name"]
            healthy.add_metric([name], 1.0 if r["state"] == "healthy" else 0.0)
            in_flight.add_metric([name], r["in_flight"])
            requests.add_metric([name], r["requests"])
            for kind, n in r["errors"].items():
                errors.add_metric([name, kind], n)
            latency.add_metric([name], count_value=r["answered"],
                               sum_value=r["first_byte_seconds_sum"])
        yield from (healthy, in_flight, requests, errors, latency)
