"""Live operations on a running server: Hypercorn on a loopback port, a real config file, tiny
random-weight GGUF models (tests/support/ggufgen.py) served by the real engine and scheduler.

A "stream in progress" is made deterministic by holding it: requests that ask for exactly
HOLD_TOKENS tokens get their first event at once and the rest only when the test opens the gate,
so the stream is verifiably open (in flight) while the config changes under it.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gguf import GGMLQuantizationType
from prometheus_client.parser import text_string_to_metric_families

from gateway.fleet.watch import WatchOptions
from gateway.local.served_model import load_served_model
from gateway.metrics import NULL_METRICS, MetricsSink, loader_with_metrics
from tests.support.ggufgen import write_tiny_llama
from tests.support.servers import Server

HOLD_TOKENS = 17
TINY_SPECIAL = {"0": -100, "1": -100, "2": -100}  # the tiny models' special tokens, banned


# ------------------------------------------------------------------ models, loader, server

@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    return {
        "a": write_tiny_llama(d / "tiny_a.gguf", qtype=GGMLQuantizationType.Q8_0, seed=1),
        "b": write_tiny_llama(d / "tiny_b.gguf", qtype=GGMLQuantizationType.Q4_0, seed=2),
        "c": write_tiny_llama(d / "tiny_c.gguf", qtype=GGMLQuantizationType.Q8_0, seed=3),
    }


class HeldGeneration:
    """A generation whose events after the first wait for the gate."""

    def __init__(self, inner: Any, gate: threading.Event) -> None:
        self._inner = inner
        self._gate = gate
        self._events: Any = None
        self._sent = 0

    def cancel(self) -> None:
        self._inner.cancel()

    def __aiter__(self) -> HeldGeneration:
        return self

    async def __anext__(self) -> Any:
        if self._events is None:
            self._events = aiter(self._inner)
        event = await anext(self._events)
        self._sent += 1
        while self._sent > 1 and not self._gate.is_set():
            await asyncio.sleep(0.01)
        return event


def hold_generations(scheduler: Any, gate: threading.Event) -> None:
    """Make the scheduler's HOLD_TOKENS generations wait for the gate after their first event."""
    submit = scheduler.submit

    def holding_submit(request: Any) -> Any:
        generation = submit(request)
        return HeldGeneration(generation, gate) if request.max_tokens == HOLD_TOKENS \
            else generation

    scheduler.submit = holding_submit


class Loads:
    """The real loader, counting loads per model and holding HOLD_TOKENS requests."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, entry: Any, metrics: MetricsSink = NULL_METRICS) -> Any:
        served = loader_with_metrics(load_served_model, metrics)(entry)
        hold_generations(served.scheduler, self.gate)
        self.count[entry.name] += 1
        return served


class LiveServer(Server):
    """The gateway for a config file that it reloads (watching it or not), with an HTTP client and
    the admin reads the tests make. Not from `apps`: the fixture opens the gate before stopping."""

    ready_path = "/health"

    def __init__(self, config_path: Path, loader: Loads, watch: WatchOptions) -> None:
        self.watch = watch
        super().__init__(config_path, loader=loader, config_path=config_path, watch=watch)
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def start(self) -> LiveServer:
        self.start_serving()
        # the watcher is watching once /admin/status lists what it watches
        if self.watch.enabled:
            wait_for(lambda: self.status()["watch"]["paths"] != [], 10, "the watcher")
        return self

    def stop(self) -> None:
        self.http.close()
        super().stop()

    def status(self) -> dict[str, Any]:
        return dict(self.http.get("/admin/status").json())

    def models(self) -> dict[str, dict[str, Any]]:
        """/admin/models by first alias (current entries only, not retiring instances)."""
        rows = self.http.get("/admin/models").json()["data"]
        return {r["aliases"][0]: r for r in rows if not r["retiring"]}

    def aliases(self) -> list[str]:
        return [m["id"] for m in self.http.get("/v1/models").json()["data"]]

    def chat(self, model: str, max_tokens: int = 3, **extra: Any) -> httpx.Response:
        return self.http.post("/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, "logit_bias": TINY_SPECIAL, **extra})


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class HeldStream:
    """A chat stream that was answered and then held: read the rest once the gate opens."""

    def __init__(self, server: LiveServer, model: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": HOLD_TOKENS, "stream": True, "logit_bias": TINY_SPECIAL}
        self._cm = httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                                timeout=60)
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200
        self._lines = self.response.iter_lines()
        self.events = [self._next_event()]  # the first one arrives; the rest are held

    def _next_event(self) -> str:
        for line in self._lines:
            if line.startswith("data: "):
                return line[len("data: "):]
        raise AssertionError("the stream ended early")

    def finish(self) -> list[dict[str, Any]]:
        """Read to the end; the parsed chunks (the stream must end with [DONE])."""
        while (event := self._next_event()) != "[DONE]":
            self.events.append(event)
        self._cm.__exit__(None, None, None)
        return [json.loads(e) for e in self.events]


def config_text(*entries: dict[str, Any], **top: Any) -> str:
    return yaml.safe_dump({**top, "registry": {"max_loaded_models": 3}, "models": list(entries)},
                          sort_keys=False)  # room for every tiny model: no evictions


def save(path: Path, *entries: dict[str, Any], **top: Any) -> None:
    path.write_text(config_text(*entries, **top))


def entry(path: Path, *aliases: str, n_ctx: int = 128) -> dict[str, Any]:
    return {"model": str(path), "aliases": list(aliases), "n_ctx": n_ctx}


@pytest.fixture
def loads() -> Loads:
    return Loads()


@pytest.fixture
def config_path(tmp_path: Path, tiny_models: dict[str, Path]) -> Path:
    path = tmp_path / "modelyard.yaml"
    save(path, entry(tiny_models["a"], "tiny-a"), entry(tiny_models["b"], "tiny-b"))
    return path


@pytest.fixture
def server(config_path: Path, loads: Loads) -> Iterator[LiveServer]:
    srv = LiveServer(config_path, loads, WatchOptions()).start()
    try:
        yield srv
    finally:
        loads.gate.set()
        srv.stop()


def finish_reasons(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["choices"][0]["finish_reason"] for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"]]


# ------------------------------------------------------------------ reload by editing the file

def test_an_added_alias_is_served_within_2s_while_the_rest_stays_warm_and_a_stream_finishes(
        server: LiveServer, config_path: Path, tiny_models: dict[str, Path],
        loads: Loads) -> None:
    assert server.chat("tiny-a").status_code == 200 and server.chat("tiny-b").status_code == 200
    loads.gate.clear()
    stream = HeldStream(server, "tiny-a")
    assert server.models()["tiny-a"]["in_flight"] == 1
    assert server.chat("tiny-a-new").status_code == 404

    save(config_path, entry(tiny_models["a"], "tiny-a", "tiny-a-new"),
         entry(tiny_models["b"], "tiny-b"), entry(tiny_models["c"], "tiny-c"))
    saved = time.monotonic()
    replies: list[httpx.Response] = []
    wait_for(lambda: replies.append(server.chat("tiny-a-new")) or replies[-1].status_code == 200,
             10, "the new alias")
    elapsed = time.monotonic() - saved
    assert elapsed < 2.0, f"the new alias took {elapsed:.2f}s"
    assert replies[-1].json()["model"] == "tiny-a-new"
    assert {r.status_code for r in replies[:-1]} <= {404}  # before: unknown, never an error
    assert server.chat("tiny-c").status_code == 200               # a new entry, served at once

    models = server.models()
    assert models["tiny-a"]["aliases"] == ["tiny-a", "tiny-a-new"]
    assert (models["tiny-a"]["state"], models["tiny-a"]["load_count"]) == ("ready", 1)
    assert (models["tiny-b"]["state"], models["tiny-b"]["load_count"]) == ("ready", 1)
    assert loads.count == Counter({"tiny-a": 1, "tiny-b": 1, "tiny-c": 1})
    assert models["tiny-a"]["in_flight"] == 1                      # the stream is still open

    loads.gate.set()
    chunks = stream.finish()
    assert finish_reasons(chunks) == ["length"]
    assert sum(len(c["choices"][0]["delta"].get("content") or "") for c in chunks
               if c["choices"]) > 0
    record = server.status()["last_reload"]
    assert record["ok"] and record["kept"] == ["tiny-a", "tiny-b"] and record["added"] == ["tiny-c"]


def test_changing_n_ctx_reloads_only_that_model(server: LiveServer, config_path: Path,
                                                tiny_models: dict[str, Path],
                                                loads: Loads) -> None:
    assert server.chat("tiny-a").status_code == 200 and server.chat("tiny-b").status_code == 200
    loads.gate.clear()
    stream = HeldStream(server, "tiny-b")  # running on the old settings during the change

    save(config_path, entry(tiny_models["a"], "tiny-a"),
         entry(tiny_models["b"], "tiny-b", n_ctx=200))
    record = wait_for(lambda: (server.status()["last_reload"] or {}), 10, "the reload")
    assert record["ok"] and record["reloaded"] == ["tiny-b"] and record["kept"] == ["tiny-a"]
    rows = server.http.get("/admin/models").json()["data"]
    old = [r for r in rows if r["retiring"]]
    assert [(r["aliases"], r["state"], r["in_flight"], r["n_ctx"]) for r in old] == \
        [(["tiny-b"], "draining", 1, 128)]

    loads.gate.set()
    assert finish_reasons(stream.finish()) == ["length"]  # the old instance finished its stream
    # token ids as the prompt: exactly 150 tokens fit the new context (200), not the old (128)
    r = server.http.post("/v1/completions", json={"model": "tiny-b", "prompt": [5] * 150,
                                                  "max_tokens": 1})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 150
    r = server.http.post("/v1/completions", json={"model": "tiny-b", "prompt": [5] * 250,
                                                  "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["n_ctx"] == 200
    assert loads.count == Counter({"tiny-a": 1, "tiny-b": 2})
    wait_for(lambda: not any(r["retiring"] for r in server.http.get("/admin/models").json()
                             ["data"]), 10, "the old instance to unload")
    assert server.models()["tiny-a"]["load_count"] == 1


def test_a_broken_file_keeps_the_old_config_serving_and_status_shows_the_errors(
        server: LiveServer, config_path: Path, tiny_models: dict[str, Path],
        loads: Loads) -> None:
    assert server.chat("tiny-a").status_code == 200
    config_path.write_text(config_path.read_text() + "  - model: [unclosed\n")
    record = wait_for(lambda: (server.status()["last_reload"] or {}), 10, "the reload")
    assert record["ok"] is False
    assert record["errors"] and record["errors"][0].startswith(f"{config_path}:")
    assert "invalid YAML" in record["errors"][0]
    assert server.status()["reloads"] == {"ok": 0, "error": 1}

    assert server.aliases() == ["tiny-a", "tiny-b"]
    assert server.chat("tiny-a").status_code == 200 and server.chat("tiny-b").status_code == 200
    assert loads.count == Counter({"tiny-a": 1, "tiny-b": 1})

    save(config_path, entry(tiny_models["a"], "tiny-a", "fixed"), entry(tiny_models["b"], "tiny-b"))
    wait_for(lambda: server.chat("fixed").status_code == 200, 10, "the fixed file")
    assert server.status()["last_reload"]["ok"] is True
    assert loads.count == Counter({"tiny-a": 1, "tiny-b": 1})


def test_saves_in_quick_succession_make_one_consistent_result(
        server: LiveServer, config_path: Path, tiny_models: dict[str, Path],
        loads: Loads) -> None:
    assert server.chat("tiny-a").status_code == 200 and server.chat("tiny-b").status_code == 200
    final = config_text(entry(tiny_models["a"], "tiny-a", "second"),
                        entry(tiny_models["b"], "tiny-b"))
    # an editor writing the file in two pieces, then saving again: the first piece alone is
    # valid YAML that drops tiny-b, which must not unload (and then reload) it
    first = config_text(entry(tiny_models["a"], "tiny-a", "first"))
    with config_path.open("w") as f:
        f.write(first)
        f.flush()
        time.sleep(0.02)
        f.seek(0)
        f.write(final)
        f.truncate()
    time.sleep(0.02)
    config_path.write_text(final)

    wait_for(lambda: "second" in server.aliases(), 10, "the last save")
    time.sleep(0.5)  # let anything still pending happen
    assert server.aliases() == ["tiny-a", "second", "tiny-b"]
    models = server.models()
    assert all(m["state"] == "ready" and m["load_count"] == 1 for m in models.values())
    assert loads.count == Counter({"tiny-a": 1, "tiny-b": 1})
    assert server.status()["reloads"]["error"] == 0


# ------------------------------------------------------------------ admin, health, metrics

def test_admin_load_unload_and_health_on_a_live_server(server: LiveServer) -> None:
    assert server.http.get("/health").json() == {"status": "ok"}
    r = server.http.post("/admin/models/tiny-b/load")
    assert r.status_code == 200 and r.json()["state"] == "ready" and r.json()["memory_bytes"] > 0
    r = server.http.post("/admin/models/tiny-b/unload")
    assert r.status_code == 200 and r.json()["state"] == "unloaded"
    assert server.models()["tiny-b"]["memory_bytes"] == 0


def test_metrics_parse_and_agree_with_the_responses(server: LiveServer) -> None:
    whole = server.chat("tiny-a", max_tokens=5).json()
    with server.http.stream("POST", "/v1/chat/completions", json={
            "model": "tiny-a", "messages": [{"role": "user", "content": "stream please"}],
            "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
            "logit_bias": TINY_SPECIAL}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    streamed = json.loads(events[-2])["usage"]
    assert server.http.post("/v1/chat/completions", json={
        "model": "nope", "messages": [{"role": "user", "content": "x"}]}).status_code == 404

    r = server.http.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(r.text) for s in f.samples}

    def get(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    chat = {"model": "tiny-a", "endpoint": "/v1/chat/completions"}
    assert get("modelyard_requests_total", status="200", **chat) == 2
    assert get("modelyard_requests_total", model="-", endpoint="/v1/chat/completions",
               status="404") == 1
    assert get("modelyard_request_duration_seconds_count", **chat) == 2
    assert get("modelyard_prompt_tokens_total", model="tiny-a") == \
        whole["usage"]["prompt_tokens"] + streamed["prompt_tokens"]
    assert get("modelyard_completion_tokens_total", model="tiny-a") == \
        whole["usage"]["completion_tokens"] + streamed["completion_tokens"] == 9
    assert get("modelyard_time_to_first_token_seconds_count", model="tiny-a") == 2
    assert get("modelyard_model_loads_total", model="tiny-a") == 1
    assert get("modelyard_loaded_models") == 1
    assert get("modelyard_loaded_bytes") == server.models()["tiny-a"]["memory_bytes"] > 0
