"""Upstream entries end to end: three `modelyard serve` processes on loopback ports, and a front
instance whose config routes aliases to them (a pool of two, one direct, one discovered).

The expectations come from the backends themselves: what a direct call streams, what each
backend's own /metrics counted, and which backend the front says served (X-Modelyard-Backend).
"""
from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.state import app_state
from tests.support.apps import Apps
from tests.support.ggufgen import write_tiny_llama
from tests.support.servers import ServerProcess, ThreadedServer

pytestmark = pytest.mark.slow

TINY_SPECIAL = {"0": -100, "1": -100, "2": -100}  # the tiny model's special tokens, banned
PROBE_INTERVAL = 0.5
LONG = 900  # tokens: long enough to be mid-stream when a backend is killed


class Backends:
    def __init__(self, tmp: Path) -> None:
        model = write_tiny_llama(tmp / "tiny.gguf", seed=8, n_ctx_train=1024)
        self.config = tmp / "backend.yaml"
        self.config.write_text(yaml.safe_dump({"models": [
            {"model": str(model), "aliases": ["tiny"], "n_ctx": 1024, "n_parallel": 8}]}))
        self.tmp = tmp
        self.servers = [self._start(name) for name in ("b1", "b2", "b3")]
        for server in self.servers:
            server.wait_ready()

    def _start(self, name: str, port: int | None = None) -> ServerProcess:
        return ServerProcess(self.config, self.tmp / f"{name}.log", port=port)

    def restart(self, i: int) -> None:
        old = self.servers[i]
        old.close()
        self.servers[i] = self._start(f"b{i + 1}", port=old.port).wait_ready()

    def close(self) -> None:
        for server in self.servers:
            server.close()


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backends]:
    b = Backends(tmp_path_factory.mktemp("upstream"))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def front(backends: Backends, module_apps: Apps) -> ThreadedServer:
    """The in-process front; set up after the backends, so it stops before them."""
    b1, b2, b3 = (s.url for s in backends.servers)
    path = backends.tmp / "front.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"aliases": ["pool"], "balance": "least_busy", "probe": {"interval": PROBE_INTERVAL},
         "upstream": [{"url": b1, "model": "tiny", "name": "b1"},
                      {"url": b2, "model": "tiny", "name": "b2"}]},
        {"aliases": ["one"], "upstream": {"url": b1, "model": "tiny", "name": "b1-direct"}},
        {"upstream": {"url": b3, "discover": True, "name": "b3"}},
    ]}))
    return module_apps.serve(path)


def _body(model: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": max_tokens, "temperature": 0, "logit_bias": TINY_SPECIAL,
            "stream": stream}


class Stream(threading.Thread):
    """One streaming chat request, its events (data lines) and the backend that served it."""

    def __init__(self, url: str, model: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.events: list[str] = []
        self.backend: str | None = None
        self.status: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", timeout=60,
                              json=_body(self.model, self.max_tokens)) as r:
                self.status, self.backend = r.status_code, r.headers.get("x-modelyard-backend")
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.error = exc

    def texts(self) -> list[str]:
        return [c["delta"].get("content") or "" for e in self.events if e != "[DONE]"
                for c in json.loads(e).get("choices", [])]


def _stream(url: str, model: str, max_tokens: int) -> Stream:
    s = Stream(url, model, max_tokens)
    s.run()
    assert s.error is None and s.status == 200, (s.status, s.error, s.events[:2])
    return s


def _served(server: ServerProcess) -> int:
    """Chat requests a backend counted itself (its /metrics)."""
    text = httpx.get(server.url + "/metrics", timeout=5).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("modelyard_requests_total{")
                   and 'endpoint="/v1/chat/completions"' in line))


def test_aliases_through_the_front_stream_the_same_tokens_as_direct_calls(
        backends: Backends, front: ThreadedServer) -> None:
    direct = _stream(backends.servers[0].url, "tiny", 48)
    assert direct.events[-1] == "[DONE]" and len("".join(direct.texts())) > 0
    for alias, backend in (("one", "b1-direct"), ("tiny", "b3"), ("pool", None)):
        through = _stream(front.url, alias, 48)
        assert through.texts() == direct.texts(), alias
        assert through.events[-1] == "[DONE]"
        assert backend is None or through.backend == backend
        # the front relays the upstream's chunks; they name the model the upstream served
        assert json.loads(through.events[0])["model"] == "tiny"
    listed = {m["id"]: m for m in httpx.get(front.url + "/v1/models").json()["data"]}
    assert {"pool", "one", "tiny"} <= set(listed)
    assert listed["tiny"]["owned_by"] == "upstream b3"  # discovered from b3's own list


def test_least_busy_spreads_16_concurrent_clients_over_two_backends(
        backends: Backends, front: ThreadedServer) -> None:
    b1, b2 = backends.servers[:2]
    before = _served(b1), _served(b2)
    streams = [Stream(front.url, "pool", 200) for _ in range(16)]
    for s in streams:
        s.start()
    for s in streams:
        s.join(60)
        assert s.error is None and s.status == 200 and s.events[-1] == "[DONE]"
    counted = _served(b1) - before[0], _served(b2) - before[1]
    said = sum(s.backend == "b1" for s in streams), sum(s.backend == "b2" for s in streams)
    assert said == counted  # the front's header agrees with what each backend served
    assert sum(counted) == 16 and abs(counted[0] - counted[1]) <= 2, counted


def test_killing_a_backend_fails_only_its_streams_and_the_pool_recovers(
        backends: Backends, front: ThreadedServer) -> None:
    streams = [Stream(front.url, "pool", LONG) for _ in range(8)]
    for s in streams:
        s.start()
    deadline = time.monotonic() + 30
    while not all(len(s.events) > 3 for s in streams):
        assert time.monotonic() < deadline, "streams did not start"
        time.sleep(0.01)
    backends.servers[0].process.send_signal(signal.SIGKILL)
    for s in streams:
        s.join(60)
        assert s.error is None and s.status == 200
    on_b1 = [s for s in streams if s.backend == "b1"]
    on_b2 = [s for s in streams if s.backend == "b2"]
    assert on_b1 and on_b2 and len(on_b1) + len(on_b2) == 8
    for s in on_b2:  # untouched: every token, then [DONE]
        assert s.events[-1] == "[DONE]" and len(s.texts()) > LONG // 2
    for s in on_b1:  # a clear error event naming the backend, no [DONE]
        error = json.loads(s.events[-1])["error"]
        assert "upstream b1 failed mid-stream" in error["message"], error
        assert error["code"] == "upstream_error" and "[DONE]" not in s.events

    # new requests go to the healthy backend at once (the cut stream marked b1 unhealthy)
    for _ in range(4):
        r = httpx.post(front.url + "/v1/chat/completions", json=_body("pool", 4, False))
        assert r.status_code == 200 and r.headers["x-modelyard-backend"] == "b2"
    row = next(r for r in httpx.get(front.url + "/admin/models").json()["data"]
               if r.get("name") == "b1")
    assert row["state"] == "unhealthy" and row["errors"]["stream"] == len(on_b1)

    backends.restart(0)  # back on its port: the probe finds it within its interval
    back = time.monotonic()
    used: set[str] = set()
    while "b1" not in used:
        assert time.monotonic() - back < PROBE_INTERVAL + 5, used
        r = httpx.post(front.url + "/v1/chat/completions", json=_body("pool", 4, False))
        assert r.status_code == 200
        used.add(r.headers["x-modelyard-backend"])
        time.sleep(0.05)


def test_a_request_failing_before_the_first_byte_is_retried_on_another_backend(
        apps: Apps, backends: Backends, tmp_path: Path) -> None:
    from tests.support.servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    path = tmp_path / "front.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"aliases": ["pool"], "probe": {"interval": "60s"},  # no probe before the request
         "upstream": [{"url": dead, "model": "tiny", "name": "dead"},
                      {"url": backends.servers[1].url, "model": "tiny", "name": "b2"}]}]}))
    server = apps.serve(path)
    # the first probe found `dead` down; mark it healthy again so the pool tries it first
    async def mark_healthy() -> None:
        pool = app_state(server.app).router.route("pool")
        pool.members[0].health.probe_ok(time.monotonic())

    server.on_loop(mark_healthy())
    direct = _stream(backends.servers[1].url, "tiny", 24)
    through = _stream(server.url, "pool", 24)
    assert through.backend == "b2" and through.texts() == direct.texts()
    rows = {r["name"]: r for r in httpx.get(server.url + "/admin/models").json()["data"]}
    assert rows["dead"]["errors"]["connect"] >= 1 and rows["dead"]["requests"] == 1
    assert rows["b2"]["requests"] == 1
