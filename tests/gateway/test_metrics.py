"""Metrics: per-app registries, the exposition parsed back with prometheus_client's own parser,
the scheduler's recording API, the request observer, and the registry's counters."""
from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.prompt import Prompt
from gateway.config import Config, ModelEntry, RegistrySettings
from gateway.fleet.registry import Registry
from gateway.generation.events import Finished, TextDelta
from gateway.metrics import (
    CONTENT_TYPE_LATEST,
    NULL_METRICS,
    Metrics,
    MetricsSink,
    RequestMetrics,
    loader_with_metrics,
)
from tests.support.apps import Apps
from tests.support.fakes import FakeModel
from tests.support.ggufgen import write_servable

MB = 1 << 20


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(sample name, sorted labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


# ------------------------------------------------------------------------------- exposition

def test_every_metric_the_issue_lists_is_exposed_with_its_type() -> None:
    metrics = Metrics()
    metrics.watch_models(lambda: [])
    exposed = types(metrics.render().decode())
    assert exposed == {
        "modelyard_requests": "counter",
        "modelyard_request_duration_seconds": "histogram",
        "modelyard_time_to_first_token_seconds": "histogram",
        "modelyard_prompt_tokens": "counter",
        "modelyard_completion_tokens": "counter",
        "modelyard_model_loads": "counter",
        "modelyard_model_load_duration_seconds": "histogram",
        "modelyard_model_load_failures": "counter",
        "modelyard_model_evictions": "counter",
        "modelyard_model_idle_unloads": "counter",
        "modelyard_config_reloads": "counter",
        "modelyard_queue_length": "gauge",
        "modelyard_active_slots": "gauge",
        "modelyard_batch_size": "histogram",
        "modelyard_prompt_cache_hit_tokens": "counter",
        "modelyard_prompt_cache_misses": "counter",
        "modelyard_loaded_models": "gauge",
        "modelyard_loaded_bytes": "gauge",
        "modelyard_model_memory_bytes": "gauge",
        "modelyard_model_in_flight": "gauge",
        "modelyard_key_requests": "counter",   # issue 14: requests per API key name
        "modelyard_draft_tokens": "counter",   # issue 31: speculative decoding's drafts
        "modelyard_draft_accepted_tokens": "counter",
    }


def test_two_apps_in_one_process_keep_separate_metrics() -> None:
    first, second = Metrics(), Metrics()  # the same names twice: no "Duplicated timeseries"
    first.request("a", "/v1/chat/completions", 200, 0.5)
    first.request("a", "/v1/chat/completions", 200, 1.5)
    second.request("a", "/v1/chat/completions", 404, 0.1)
    one, two = parse(first.render().decode()), parse(second.render().decode())
    labels = {"model": "a", "endpoint": "/v1/chat/completions"}
    assert value(one, "modelyard_requests_total", status="200", **labels) == 2
    assert value(one, "modelyard_requests_total", status="404", **labels) is None
    assert value(two, "modelyard_requests_total", status="404", **labels) == 1
    assert value(one, "modelyard_request_duration_seconds_sum", **labels) == 2.0
    assert value(one, "modelyard_request_duration_seconds_bucket", le="1.0", **labels) == 1
    assert value(one, "modelyard_request_duration_seconds_bucket", le="+Inf", **labels) == 2


def test_the_scheduler_api_records_what_it_is_told() -> None:
    metrics = Metrics()
    metrics.set_queue("m", 3)
    metrics.set_queue("m", 2)
    metrics.set_active_slots("m", 4)
    for size in (1, 4, 4):
        metrics.observe_batch("m", size)
    metrics.add_prompt_cache_hits("m", 120)
    metrics.add_prompt_cache_hits("m", 30)
    s = parse(metrics.render().decode())
    assert value(s, "modelyard_queue_length", model="m") == 2
    assert value(s, "modelyard_active_slots", model="m") == 4
    assert value(s, "modelyard_batch_size_count", model="m") == 3
    assert value(s, "modelyard_batch_size_sum", model="m") == 9
    assert value(s, "modelyard_batch_size_bucket", model="m", le="2.0") == 1
    assert value(s, "modelyard_prompt_cache_hit_tokens_total", model="m") == 150


def test_the_null_sink_takes_every_call_a_real_one_does() -> None:
    recording = {name for name, _ in inspect.getmembers(Metrics, inspect.isfunction)
                 if not name.startswith("_") and name not in ("watch_models", "render")}
    assert recording == {name for name, _ in inspect.getmembers(MetricsSink, inspect.isfunction)
                         if not name.startswith("_")}
    for name in recording:  # same signatures, and the null sink accepts them all
        assert inspect.signature(getattr(Metrics, name)) == \
            inspect.signature(getattr(MetricsSink, name))
        params = list(inspect.signature(getattr(MetricsSink, name)).parameters)[1:]
        args = {"model": "m", "endpoint": "/x", "status": 200, "ok": True}
        getattr(NULL_METRICS, name)(*[args.get(p, 1) for p in params])


def test_scrape_time_gauges_come_from_the_registry_snapshot() -> None:
    rows = [
        {"aliases": ["a"], "state": "ready", "memory_bytes": 5 * MB, "in_flight": 2,
         "retiring": False},
        {"aliases": ["a"], "state": "draining", "memory_bytes": 4 * MB, "in_flight": 1,
         "retiring": True},
        {"aliases": ["b"], "state": "loading", "memory_bytes": 3 * MB, "in_flight": 0,
         "retiring": False},
        {"aliases": ["c"], "state": "unloaded", "memory_bytes": 0, "in_flight": 0,
         "retiring": False},
    ]
    metrics = Metrics()
    metrics.watch_models(lambda: rows)
    s = parse(metrics.render().decode())
    assert value(s, "modelyard_loaded_models") == 2
    assert value(s, "modelyard_loaded_bytes") == 12 * MB
    assert value(s, "modelyard_model_in_flight", model="a", state="ready") == 2
    assert value(s, "modelyard_model_in_flight", model="a", state="draining (old)") == 1
    assert value(s, "modelyard_model_memory_bytes", model="b", state="loading") == 3 * MB
    rows.pop(0)  # read again at every scrape
    assert value(parse(metrics.render().decode()), "modelyard_loaded_models") == 1


# ---------------------------------------------------------------------- loader and requests

def test_the_loader_gets_metrics_only_when_it_asks_for_them() -> None:
    metrics = Metrics()
    seen: list[Any] = []

    def plain(entry: Any) -> str:
        return "plain"

    def wants(entry: Any, metrics: MetricsSink = NULL_METRICS) -> str:
        seen.append(metrics)
        return "wants"

    assert loader_with_metrics(plain, metrics) is plain
    assert loader_with_metrics(wants, metrics)("entry") == "wants" and seen == [metrics]


class Request:
    def __init__(self, prompt: Prompt) -> None:
        self.prompt = prompt


def test_request_metrics_count_tokens_like_usage_and_time_the_first_token() -> None:
    metrics = Metrics()
    observed = RequestMetrics(metrics, "alias", started=0.0)
    first, second = Prompt.of_tokens([1, 2, 3]), Prompt.of_tokens([4, 5])
    # three choices of the first prompt (they share its Prompt), one of the second
    requests = [Request(first), Request(first), Request(first), Request(second)]
    for request in requests:
        n = len(request.prompt)
        for event in [TextDelta("", []), TextDelta("he", []), TextDelta("llo", []),
                      Finished("length", n, 4)]:
            observed.event(request, event)  # type: ignore[arg-type]
    observed.embedded(4)
    s = parse(metrics.render().decode())
    assert value(s, "modelyard_prompt_tokens_total", model="alias") == 3 + 2 + 4
    assert value(s, "modelyard_completion_tokens_total", model="alias") == 4 * 4
    assert value(s, "modelyard_time_to_first_token_seconds_count", model="alias") == 1


def test_first_token_buckets_resolve_a_small_models_latencies() -> None:
    """Under load a small model's first tokens come 10 ms - 1 s after the request: the histogram
    must tell a 40 ms p99 from a 120 ms one (the latency buckets jump from 0.05 to 0.1 to 0.25)."""
    metrics = Metrics()
    for seconds in (0.012, 0.04, 0.04, 0.12, 0.6):
        metrics.first_token("m", seconds)
    s = parse(metrics.render().decode())

    def below(le: str) -> float | None:
        return value(s, "modelyard_time_to_first_token_seconds_bucket", model="m", le=le)
    assert below("0.01") == 0
    assert below("0.015") == 1
    assert below("0.03") == 1 and below("0.05") == 3
    assert below("0.1") == 3 and below("0.15") == 4
    assert below("0.5") == 4 and below("0.75") == 5


# ---------------------------------------------------------------------------------- registry

def test_the_registry_counts_loads_failures_evictions_and_idle_unloads(tmp_path: Path) -> None:
    metrics = Metrics()
    failing = {"bad"}

    def loader(entry: ModelEntry) -> FakeModel:
        if entry.name in failing:
            raise OSError("truncated file")
        return FakeModel(entry)

    entries = [ModelEntry(model=tmp_path / f"{n}.gguf", aliases=[n]) for n in ("a", "b", "bad")]
    entries.append(ModelEntry(model=tmp_path / "idle.gguf", aliases=["idle"], idle_timeout=0.05))
    config = Config(models=entries, registry=RegistrySettings(max_loaded_models=1))

    async def main() -> None:
        registry = Registry(config, loader=loader, estimator=lambda e: MB, metrics=metrics)
        await registry.start()
        for alias in ("a", "b", "a"):          # one slot: each load evicts the other
            async with registry.lease(alias):
                pass
        with pytest.raises(Exception, match="truncated"):
            await registry.acquire("bad")
        async with registry.lease("idle"):     # evicts a, then idles out
            pass
        deadline = asyncio.get_running_loop().time() + 10
        while registry.snapshot()[3]["state"] != "unloaded":
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        await registry.close()

    asyncio.run(main())
    s = parse(metrics.render().decode())
    loads = {m: value(s, "modelyard_model_loads_total", model=m) for m in ("a", "b", "idle")}
    assert loads == {"a": 2, "b": 1, "idle": 1}
    assert value(s, "modelyard_model_load_failures_total", model="bad") == 1
    assert value(s, "modelyard_model_evictions_total", model="a") == 2   # for b, for idle
    assert value(s, "modelyard_model_evictions_total", model="b") == 1
    assert value(s, "modelyard_model_idle_unloads_total", model="idle") == 1
    assert value(s, "modelyard_model_load_duration_seconds_count", model="a") == 2


# -------------------------------------------------------------------------------- the app

def test_the_app_counts_requests_by_alias_route_and_status(apps: Apps, tmp_path: Path) -> None:
    write_servable(tmp_path / "a.gguf")
    client = apps.client({"models": [{"model": "a.gguf", "aliases": ["a", "a2"]}]}, loader=FakeModel)
    client.post("/admin/models/a2/load")
    client.post("/admin/models/a2/load")
    client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [
        {"role": "user", "content": "hi"}]})
    client.get("/no/such/page")
    client.get("/v1/models")
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE_LATEST
    s = parse(r.text)
    assert value(s, "modelyard_requests_total", model="a2", status="200",
                 endpoint="/admin/models/{alias:path}/load") == 2
    assert value(s, "modelyard_requests_total", model="-", status="404",  # no free-text labels
                 endpoint="/v1/chat/completions") == 1
    assert value(s, "modelyard_requests_total", model="-", status="404", endpoint="unmatched") == 1
    assert value(s, "modelyard_requests_total", model="-", status="200", endpoint="/v1/models") == 1
    assert value(s, "modelyard_model_loads_total", model="a") == 1
    assert value(s, "modelyard_loaded_models") == 1 and value(s, "modelyard_loaded_bytes") == MB
