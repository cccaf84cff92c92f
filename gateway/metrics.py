"""Prometheus metrics: one private CollectorRegistry per app, so apps in one process never clash.

Who records what:

    app.RequestLog (ASGI middleware)  requests_total{model,endpoint,status}, request_duration
    RequestMetrics (one per request)  time_to_first_token, prompt/completion tokens: told each
                                      event as the route receives it (GenerationRequest.observer)
    registry                          model loads, load failures, evictions, idle unloads
    watch.Reloader                    config reloads by result
    scheduler (optional)              queue length, active slots, batch size, prompt-cache hits
    at scrape time                    loaded models and bytes, per-model state/memory/in flight,
                                      read from registry.snapshot()

Label `model` is a configured alias (the one a request named, or an entry's first alias for
model-level series), never free text from a request, so the number of series stays bounded.

For the scheduler: everything that may record takes a `MetricsSink`; `NULL_METRICS` is the one to
default to, so recording never needs an `if`. The app hands its `Metrics` to the loader when the
loader accepts a `metrics` keyword (`load_served_model(entry, metrics=...)`), and the loader
passes it on to the scheduler, which calls (from any thread; prometheus-client is thread-safe):

    metrics.set_queue(model, n)             requests waiting for a slot (set 0 on close)
    metrics.set_active_slots(model, n)      slots generating right now (set 0 on close)
    metrics.observe_batch(model, size)      sequences in one forward pass
    metrics.add_prompt_cache_hits(model, n) prompt tokens reused instead of evaluated
    metrics.add_prompt_cache_miss(model, reason)  a block or more computed: no_entry, evicted, diverged
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from gateway.activity import ActivityHistory
from gateway.generation.events import Event, Finished, GenerationRequest, TextDelta

if TYPE_CHECKING:  # the registry records into these metrics: no import at run time
    from gateway.fleet.registry import ModelRow

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "MetricsSink", "NULL_METRICS", "RequestMetrics",
           "loader_with_metrics"]

# Latency buckets: a tiny model answers in milliseconds, a long stream takes minutes.
_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Time to first token: a small model's under load lives between 10 ms and a second, where the
# latency buckets are coarse; these resolve a p99 there to within about a third.
_FIRST_TOKEN_SECONDS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                        0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_LOAD_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_BATCH = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
NO_MODEL = "-"  # the request failed before it was tied to a configured model


class MetricsSink:
    """Everything that can be recorded; this base records nothing (see NULL_METRICS)."""

    # HTTP (app middleware, routes)
    def request(self, model: str, endpoint: str, status: int, seconds: float) -> None: ...
    def first_token(self, model: str, seconds: float) -> None: ...
    def tokens(self, model: str, prompt: int, completion: int) -> None: ...

    # registry and reloads
    def model_loaded(self, model: str, seconds: float) -> None: ...
    def model_load_failed(self, model: str) -> None: ...
    def model_evicted(self, model: str) -> None: ...
    def model_idle_unloaded(self, model: str) -> None: ...
    def config_reloaded(self, ok: bool) -> None: ...

    # scheduler (continuous batching)
    def set_queue(self, model: str, n: int) -> None: ...
    def set_active_slots(self, model: str, n: int) -> None: ...
    def observe_batch(self, model: str, size: int) -> None: ...
    def add_prompt_cache_hits(self, model: str, n: int) -> None: ...
    def add_prompt_cache_miss(self, model: str, reason: str) -> None: ...
    def drafted(self, model: str, n: int, accepted: int) -> None: ...
    def key_request(self, key: str, status: int) -> None: ...


NULL_METRICS = MetricsSink()


class Metrics(MetricsSink):
    """The app's metrics, in their own registry; `render()` is the /metrics body."""

    def __init__(self) -> None:
        # `*_created` timestamps would double the text and Prometheus' text format reads them as
        # separate gauges; the switch is process-wide, and the only metrics here are ours.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream
        self.registry = CollectorRegistry()
        r = self.registry
        self._requests = Counter("modelyard_requests", "HTTP requests by model alias, endpoint "
                                 "and status", ["model", "endpoint", "status"], registry=r)
        self._request_seconds = Histogram(
            "modelyard_request_duration_seconds", "Time from request to the last byte sent "
            "(streams included)", ["model", "endpoint"], buckets=_SECONDS, registry=r)
        self._first_token = Histogram(
            "modelyard_time_to_first_token_seconds", "Time from request to the first generated "
            "text (model loading and queueing included)", ["model"], buckets=_FIRST_TOKEN_SECONDS,
            registry=r)
        self._prompt_tokens = Counter("modelyard_prompt_tokens", "Prompt tokens of finished "
                                      "requests, as billed in usage", ["model"], registry=r)
        self._completion_tokens = Counter("modelyard_completion_tokens", "Generated tokens of "
                                          "finished generations", ["model"], registry=r)
        self._loads = Counter("modelyard_model_loads", "Successful model loads", ["model"],
                              registry=r)
        self._load_seconds = Histogram("modelyard_model_load_duration_seconds", "Time a "
                                       "successful load took", ["model"],
                                       buckets=_LOAD_SECONDS, registry=r)
        self._load_failures = Counter("modelyard_model_load_failures", "Failed model loads",
                                      ["model"], registry=r)
        self._evictions = Counter("modelyard_model_evictions", "Models unloaded to make room "
                                  "(LRU) or to fit lowered limits", ["model"], registry=r)
        self._idle_unloads = Counter("modelyard_model_idle_unloads", "Models unloaded after "
                                     "their idle timeout", ["model"], registry=r)
        self._reloads = Counter("modelyard_config_reloads", "Config reloads by result",
                                ["result"], registry=r)
        self._queue = Gauge("modelyard_queue_length", "Requests waiting for a scheduler slot",
                            ["model"], registry=r)
        self._active_slots = Gauge("modelyard_active_slots", "Scheduler slots generating now",
                                   ["model"], registry=r)
        self._batch = Histogram("modelyard_batch_size", "Sequences per forward pass", ["model"],
                                buckets=_BATCH, registry=r)
        self._cache_hits = Counter("modelyard_prompt_cache_hit_tokens", "Prompt tokens reused "
                                   "from the prompt cache instead of evaluated", ["model"],
                                   registry=r)
        self._cache_misses = Counter("modelyard_prompt_cache_misses", "Requests that computed "
                                     "a block (256 tokens) or more of their prompt, by why the "
                                     "cache fell short: no_entry, evicted, diverged",
                                     ["model", "reason"], registry=r)
        self._drafted = Counter("modelyard_draft_tokens", "Drafted tokens the model checked "
                                "(speculative decoding)", ["model"], registry=r)
        self._draft_accepted = Counter("modelyard_draft_accepted_tokens", "Drafted tokens the "
                                       "model accepted; over modelyard_draft_tokens: the "
                                       "acceptance rate", ["model"], registry=r)
        self._key_requests = Counter("modelyard_key_requests", "Requests by API key name (never "
                                     "the key) and status; key '-' = no or an unknown key",
                                     ["key", "status"], registry=r)
        for result in ("ok", "error"):  # both series exist from the start, at 0
            self._reloads.labels(result)
        self.activity = ActivityHistory()  # the console's first view of the last minutes

    # -- recording -----------------------------------------------------------------------------

    def key_request(self, key: str, status: int) -> None:
        self._key_requests.labels(key, str(status)).inc()

    def request(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        self._requests.labels(model, endpoint, str(status)).inc()
        self._request_seconds.labels(model, endpoint).observe(seconds)
        self.activity.request(model, status)

    def first_token(self, model: str, seconds: float) -> None:
        self._first_token.labels(model).observe(seconds)
        self.activity.first_token(model, seconds)

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        self._prompt_tokens.labels(model).inc(prompt)
        self._completion_tokens.labels(model).inc(completion)
        self.activity.tokens(model, prompt, completion)

    def model_loaded(self, model: str, seconds: float) -> None:
        self._loads.labels(model).inc()
        self._load_seconds.labels(model).observe(seconds)

    def model_load_failed(self, model: str) -> None:
        self._load_failures.labels(model).inc()

    def model_evicted(self, model: str) -> None:
        self._evictions.labels(model).inc()

    def model_idle_unloaded(self, model: str) -> None:
        self._idle_unloads.labels(model).inc()

    def config_reloaded(self, ok: bool) -> None:
        self._reloads.labels("ok" if ok else "error").inc()

    def set_queue(self, model: str, n: int) -> None:
        self._queue.labels(model).set(n)

    def set_active_slots(self, model: str, n: int) -> None:
        self._active_slots.labels(model).set(n)

    def observe_batch(self, model: str, size: int) -> None:
        self._batch.labels(model).observe(size)
        self.activity.batch(model, size)

    def add_prompt_cache_hits(self, model: str, n: int) -> None:
        self._cache_hits.labels(model).inc(n)

    def add_prompt_cache_miss(self, model: str, reason: str) -> None:
        self._cache_misses.labels(model, reason).inc()

    def drafted(self, model: str, n: int, accepted: int) -> None:
        self._drafted.labels(model).inc(n)
        self._draft_accepted.labels(model).inc(accepted)

    # -- exposition ----------------------------------------------------------------------------

    def watch_models(self, snapshot: Callable[[], Sequence[ModelRow]]) -> None:
        """Report the registry's models at every scrape (call once, with registry.snapshot)."""
        self.registry.register(_ModelsCollector(snapshot))

    def render(self) -> bytes:
        """The Prometheus text exposition; call it on the event loop (snapshot() lives there)."""
        return generate_latest(self.registry)


class _ModelsCollector(Collector):
    """Gauges read from registry.snapshot() when scraped, so they are never stale."""

    def __init__(self, snapshot: Callable[[], Sequence[ModelRow]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        rows = self._snapshot()
        loaded = [r for r in rows if r["state"] in ("ready", "draining")]
        yield GaugeMetricFamily("modelyard_loaded_models", "Models loaded (ready or draining)",
                                value=len(loaded))
        yield GaugeMetricFamily("modelyard_loaded_bytes", "Memory held by models (weights + KV "
                                "cache; the estimate while loading)",
                                value=sum(r["memory_bytes"] for r in rows))
        memory = GaugeMetricFamily("modelyard_model_memory_bytes", "Memory held by a model",
                                   labels=["model", "state"])
        in_flight = GaugeMetricFamily("modelyard_model_in_flight", "Requests holding a model",
                                      labels=["model", "state"])
        for r in rows:
            # a retiring instance (old settings, draining) is a separate series from its successor
            state = r["state"] + (" (old)" if r["retiring"] else "")
            memory.add_metric([r["aliases"][0], state], r["memory_bytes"])
            in_flight.add_metric([r["aliases"][0], state], r["in_flight"])
        yield memory
        yield in_flight


# -------------------------------------------------------------------------- loader and requests

M = TypeVar("M")


def loader_with_metrics(loader: Callable[..., M], metrics: MetricsSink) -> Callable[[Any], M]:
    """`loader`, handed `metrics=` when its signature takes it (the scheduler records into it)."""
    try:
        takes = "metrics" in inspect.signature(loader).parameters
    except (TypeError, ValueError):  # builtins and some callables have no signature
        takes = False
    if not takes:
        return loader
    return lambda entry: loader(entry, metrics=metrics)


class RequestMetrics:
    """One HTTP request's share of the metrics, recorded where its events already pass.

    The route hands it to the request's plan; each GenerationRequest carries it as `observer`,
    and scheduler.Generation tells it every event as the route receives it. `started` is the
    request's perf_counter() at arrival: time to first token includes waiting for the model to
    load and for a scheduler slot, as a client experiences it.
    """

    def __init__(self, metrics: MetricsSink, model: str, started: float) -> None:
        self._metrics = metrics
        self._model = model
        self._started = started
        self._first_seen = False
        self._billed_prompts: set[int] = set()

    def event(self, request: GenerationRequest, event: Event) -> None:
        if not self._first_seen and isinstance(event, TextDelta) and event.text:
            self._first_seen = True
            self._metrics.first_token(self._model, time.perf_counter() - self._started)
        if isinstance(event, Finished):
            # The n choices of one prompt share its Prompt, and usage bills the prompt once.
            key = id(request.prompt)
            prompt = 0 if key in self._billed_prompts else event.prompt_tokens
            self._billed_prompts.add(key)
            self._metrics.tokens(self._model, prompt, event.completion_tokens)

    def embedded(self, n_tokens: int) -> None:
        """One input embedded: its tokens are billed as prompt tokens."""
        self._metrics.tokens(self._model, n_tokens, 0)
