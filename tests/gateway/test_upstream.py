"""Upstream entries against a scripted OpenAI-compatible server in this process: the config keys,
what is forwarded, errors and retries, cancellation, hot reload, pools and health."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.backends.health import Failure, Health, HealthState, Stats
from gateway.backends.pool import Pool
from gateway.config import Config, ConfigError, load_config
from gateway.config.upstream import UpstreamEntry
from tests.support.apps import Apps
from tests.support.servers import ThreadedServer, free_port

KEY = "sk-upstream-secret-123"


class Scripted:
    """An OpenAI-compatible server whose answers a test sets: it records what it received."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.status = 200
        self.error_body: dict[str, Any] | None = None
        self.stream_delay = 0.0
        self.stream_ended = threading.Event()   # its stream's generator finished (or was closed)
        self.app = Starlette(routes=[
            Route("/v1/models", self.models), Route("/health", self.health),
            Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": f"{self.name}-model",
                                                         "object": "model"}]})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def chat(self, request: Request) -> Response:
        body = await request.body()
        self.received.append((dict(request.headers), body))
        if self.status != 200:
            return JSONResponse(self.error_body or {"error": {"message": "busy"}},
                                status_code=self.status)
        data = json.loads(body)
        if not data.get("stream"):
            return JSONResponse({"object": "chat.completion", "model": data.get("model"),
                                 "choices": [{"index": 0, "message": {
                                     "role": "assistant", "content": f"from {self.name}"}}]})
        return StreamingResponse(self._events(), media_type="text/event-stream")

    async def _events(self) -> AsyncIterator[bytes]:
        try:
            for i in range(50):
                chunk = {"choices": [{"index": 0, "delta": {"content": f"{self.name}{i} "}}]}
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
                await asyncio.sleep(self.stream_delay)
            yield b"data: [DONE]\n\n"
        finally:
            self.stream_ended.set()


@pytest.fixture
def upstreams(apps: Apps) -> list[tuple[Scripted, ThreadedServer]]:
    """Two scripted servers; opened before any front, so `apps` stops them after it."""
    return [(scripted, apps.host(scripted.app)) for scripted in (Scripted("a"), Scripted("b"))]


def _front(apps: Apps, models: list[dict[str, Any]], **top: Any) -> ThreadedServer:
    return apps.serve({**top, "models": models},
                      ready_path="/health")  # public with auth configured too


def _chat(url: str, model: str, **extra: Any) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=10, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], **extra})


# -- config ----------------------------------------------------------------------------------

def test_an_entry_with_upstream_reads_its_key_from_a_file_or_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    monkeypatch.setenv("OTHER_KEY", "sk-from-env")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"aliases": ["chat"], "balance": "round_robin", "probe": {"interval": "2s"},
         "upstream": [{"url": "http://gpu-1:8000", "api_key_file": "key", "timeout": "90s",
                       "max_concurrent": 3, "headers": {"X-Team": "search"}, "model": "m"},
                      {"url": "https://gpu-2/v1/", "api_key": "${OTHER_KEY}"}]}]}))
    config = load_config(path)
    entry = config.upstreams[0]
    first, second = entry.servers()
    assert first.api_key is not None and first.api_key.get_secret_value() == KEY
    assert second.api_key is not None and second.api_key.get_secret_value() == "sk-from-env"
    assert first.url == "http://gpu-1:8000/v1" and second.url == "https://gpu-2/v1"
    assert (first.timeout, first.max_concurrent, entry.balance, entry.probe.interval) == (
        90.0, 3, "round_robin", 2.0)
    assert config.aliases() == ["chat"] and config.default_alias() == "chat"
    assert KEY not in repr(config) and KEY not in str(config.model_dump())


@pytest.mark.parametrize("entry, message", [
    ({"aliases": ["x"], "model": "m.gguf", "upstream": {"url": "http://h"}},
     "models.0.model: give `model` (a local GGUF) or `upstream`, not both"),
    ({"aliases": ["x"], "upstream": {"url": "ftp://h"}},
     "models.0.upstream.0.url: must be an http:// or https:// URL"),
    ({"aliases": ["x"], "upstream": {"url": "http://user:pw@h"}},
     "models.0.upstream.0.url: must not hold credentials"),
    ({"aliases": ["x"], "upstream": {"url": "http://h", "timout": 3}},
     "models.0.upstream.0.timout: unknown key (did you mean 'timeout'?)"),
    ({"upstream": {"url": "http://h"}}, "needs aliases (or a server with `discover: true`)"),
    ({"aliases": ["x"], "upstream": [{"url": "http://h"}, {"local": "nobody"}]},
     "local: 'nobody' is not the alias of a local model entry"),
    ({"aliases": ["x"], "balance": "random", "upstream": {"url": "http://h"}},
     "models.0.balance: Input should be 'least_busy' or 'round_robin'"),
])
def test_upstream_mistakes_are_config_errors(tmp_path: Path, entry: dict[str, Any],
                                             message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert any(message in e for e in err.value.errors), err.value.errors


def test_an_upstream_alias_must_not_repeat_a_local_one(tmp_path: Path) -> None:
    from tests.support.ggufgen import write_tiny_llama

    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=1)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"model": str(model), "aliases": ["tiny"]},
        {"aliases": ["tiny"], "upstream": {"url": "http://h"}}]}))
    with pytest.raises(ConfigError, match=r"duplicate alias .tiny.: models\.0 already"):
        load_config(path)


# -- forwarding ------------------------------------------------------------------------------

def test_the_body_goes_upstream_as_received_with_the_configured_key_and_headers(
        apps: Apps, upstreams: list[tuple[Scripted, ThreadedServer]]) -> None:
    (a, server), _ = upstreams
    front = _front(apps, [{"aliases": ["chat"], "upstream": {
        "url": server.url, "api_key": KEY, "headers": {"X-Team": "search"}}}])
    raw = (b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], '
           b'"vendor_field": {"beam": 4},   "temperature": 0.5}')
    r = httpx.post(front.url + "/v1/chat/completions", content=raw,
                   headers={"Content-Type": "application/json",
                            "Authorization": "Bearer client-key"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "from a"
    headers, body = a.received[-1]
    assert body == raw  # byte for byte: fields modelyard does not parse arrive
    assert headers["authorization"] == f"Bearer {KEY}"  # ours, not the client's
    assert headers["x-team"] == "search"


def test_a_configured_upstream_model_replaces_only_the_model_field(
        apps: Apps, upstreams: list[tuple[Scripted, ThreadedServer]]) -> None:
    (a, server), _ = upstreams
    front = _front(apps, [{"aliases": ["chat"], "upstream": {
        "url": server.url, "model": "meta/llama-3"}}])
    assert _chat(front.url, "chat", seed=7, vendor={"x": [1, 2]}).status_code == 200
    sent = json.loads(a.received[-1][1])
    assert sent == {"model": "meta/llama-3", "messages": [{"role": "user", "content": "hi"}],
                    "seed": 7, "vendor": {"x": [1, 2]}}


def test_upstream_errors_keep_openai_shape_name_the_backend_and_mask_its_key(
        apps: Apps, upstreams: list[tuple[Scripted, ThreadedServer]]) -> None:
    (a, server), _ = upstreams
    a.status = 400
    a.error_body = {"error": {"message": f"bad key {KEY} or bad request", "type":
                              "invalid_request_error", "param": "messages", "code": "bad"}}
    front = _front(apps, [{"aliases": ["chat"], "upstream": {
        "url": server.url, "api_key": KEY, "name": "gpu-a"}}])
    r = _chat(front.url, "chat")
    assert r.status_code == 400 and len(a.received) == 1  # a 400 is not retried
    error = r.json()["error"]
    assert error["message"] == "upstream gpu-a answered 400: bad key *** or bad request"
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", "messages", "bad")
    assert KEY not in r.text


def test_a_503_before_any_byte_is_retried_on_the_other_server(
        apps: Apps, upstreams: list[tuple[Scripted, ThreadedServer]]) -> None:
    (a, server_a), (b, server_b) = upstreams
    a.status = 503
    front = _front(apps, [{"aliases": ["chat"], "balance": "round_robin",
                               "upstream": [{"url": server_a.url, "name": "a"},
                                            {"url": server_b.url, "name": "b"}]}])
    r = _chat(front.url, "chat", stream=True)
    assert r.status_code == 200 and r.headers["x-modelyard-backend"] == "b"
    assert r.text.endswith("data: [DONE]\n\n") and len(a.received) == 1
    # a was marked unhealthy: the next requests skip it
    for _ in range(3):
        assert _chat(front.url, "chat").headers["x-modelyard-backend"] == "b"
    assert len(a.received) == 1
    b.status = 503  # both down: the one retry, then the error names the last one tried
    r = _chat(front.url, "chat")
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
    assert r.json()["error"]["message"].startswith("upstream ")


def test_an_unreachable_server_is_a_502_naming_it(apps: Apps) -> None:
    front = _front(apps, [{"aliases": ["chat"], "upstream": {
        "url": f"http://127.0.0.1:{free_port()}", "name": "gone", "api_key": KEY}}])
    r = _chat(front.url, "chat")
    error = r.json()["error"]
    assert r.status_code == 502 and error["code"] == "upstream_unavailable"
    assert error["message"].startswith("upstream gone: cannot connect")
    assert KEY not in r.text


def test_a_client_leaving_mid_stream_closes_the_upstream_stream(
        apps: Apps, upstreams: list[tuple[Scripted, ThreadedServer]]) -> None:
    (a, server), _ = upstreams
    a.stream_delay = 0.2  # 50 chunks: 10 s if nobody stops it
    front = _front(apps, [{"aliases": ["chat"], "upstream": {"url": server.url}}])
    with httpx.stream("POST", front.url + "/v1/chat/completions", json={
            "model": "chat", "stream": True, "messages": []}) as r:
        assert next(r.iter_lines()).startswith("data: ")
    started = time.monotonic()
    assert a.stream_ended.wait(5)
    assert time.monotonic() - started < 3  # ended by the disconnect, not by running out
    rows = httpx.get(front.url + "/admin/models").json()["data"]
    assert rows[0]["in_flight"] == 0


def test_discovered_aliases_are_listed_and_served(
        apps: Apps, upstreams: list[tuple[Scripted, ThreadedServer]]) -> None:
    (a, server), _ = upstreams
    front = _front(apps, [{"upstream": {"url": server.url, "discover": True, "name": "a"}}])
    ids = [m["id"] for m in httpx.get(front.url + "/v1/models").json()["data"]]
    assert ids == ["a-model"]
    r = _chat(front.url, "a-model")
    assert r.status_code == 200 and json.loads(a.received[-1][1])["model"] == "a-model"
    assert httpx.get(front.url + "/v1/models/a-model").json()["owned_by"] == "upstream a"
    missing = _chat(front.url, "nothing")
    assert missing.status_code == 404 and "a-model" in missing.json()["error"]["message"]


def test_a_key_limited_to_some_models_may_not_use_other_upstream_aliases(
        apps: Apps, upstreams: list[tuple[Scripted, ThreadedServer]]) -> None:
    (_, server), _ = upstreams
    front = _front(apps, [{"aliases": ["chat"], "upstream": {"url": server.url}},
                              {"aliases": ["other"], "upstream": {"url": server.url}}],
                   auth={"keys": [{"name": "k", "key": "sk-client", "models": ["chat"]}]})
    auth = {"Authorization": "Bearer sk-client"}
    body = {"messages": [{"role": "user", "content": "hi"}]}
    ok = httpx.post(front.url + "/v1/chat/completions", headers=auth,
                    json={**body, "model": "chat"})
    refused = httpx.post(front.url + "/v1/chat/completions", headers=auth,
                         json={**body, "model": "other"})
    assert ok.status_code == 200
    assert refused.status_code == 403 and refused.json()["error"]["code"] == (
        "model_not_allowed")
    listed = httpx.get(front.url + "/v1/models", headers=auth).json()["data"]
    assert [m["id"] for m in listed] == ["chat"]


def test_metrics_show_each_upstream_server(
        apps: Apps, upstreams: list[tuple[Scripted, ThreadedServer]]) -> None:
    (_, server), _ = upstreams
    front = _front(apps, [{"aliases": ["chat"], "upstream": {"url": server.url,
                                                                 "name": "a"}}])
    _chat(front.url, "chat")
    text = httpx.get(front.url + "/metrics").text
    assert 'modelyard_upstream_healthy{backend="a"} 1.0' in text
    assert 'modelyard_upstream_requests_total{backend="a"} 1.0' in text
    assert 'modelyard_upstream_first_byte_seconds_count{backend="a"} 1.0' in text
    assert 'modelyard_upstream_errors_total{backend="a",kind="connect"} 0.0' in text


# -- hot reload ------------------------------------------------------------------------------

def test_a_reload_moves_new_requests_while_running_ones_finish_on_the_old_server(
        apps: Apps, tmp_path: Path, upstreams: list[tuple[Scripted, ThreadedServer]]) -> None:
    (a, server_a), (_, server_b) = upstreams
    a.stream_delay = 0.02  # about a second
    path = tmp_path / "front.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"aliases": ["chat"], "upstream": {"url": server_a.url, "name": "a"}}]}))
    front = apps.serve(path)
    with httpx.stream("POST", front.url + "/v1/chat/completions", timeout=10, json={
            "model": "chat", "stream": True, "messages": []}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        path.write_text(yaml.safe_dump({"models": [
            {"aliases": ["chat"], "upstream": {"url": server_b.url, "name": "b"}}]}))
        assert httpx.post(front.url + "/admin/reload").status_code == 200
        assert _chat(front.url, "chat").headers["x-modelyard-backend"] == "b"
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]" and '"a49 "' in rest[-2]  # all of it, from a
    deadline = time.monotonic() + 5
    while any(row["name"] == "a" for row in httpx.get(front.url + "/admin/models").json()[
            "data"]):  # retired once its request is done
        assert time.monotonic() < deadline
        time.sleep(0.05)


# -- pools and health (no I/O) ------------------------------------------------------------------

class _Member:
    kind = "upstream"

    def __init__(self, label: str, max_concurrent: int | None = None) -> None:
        self.label = label
        self.max_concurrent = max_concurrent
        self.health = Health(cooldown=10.0, probing=True)
        self.stats = Stats()

    async def serve(self, call: object) -> Response:
        raise NotImplementedError


def test_least_busy_picks_the_member_with_fewest_in_flight_and_rotates_ties() -> None:
    a, b, c = _Member("a"), _Member("b"), _Member("c")
    pool = Pool("p", [a, b, c], "least_busy")
    picks = []
    for _ in range(6):  # counting each pick in flight, as serve() does
        m = pool.pick()
        assert m is not None
        m.stats.in_flight += 1
        picks.append(m.label)
    assert sorted(picks) == ["a", "a", "b", "b", "c", "c"]
    b.stats.in_flight = 0
    assert pool.pick() is b


def test_round_robin_takes_turns_and_skips_full_and_unhealthy_members() -> None:
    a, b, c = _Member("a"), _Member("b", max_concurrent=1), _Member("c")
    pool = Pool("p", [a, b, c], "round_robin")
    assert [pool.pick().label for _ in range(3)] == ["a", "b", "c"]  # type: ignore[union-attr]
    b.stats.in_flight = 1  # full
    c.health.failed(time.monotonic(), "down")
    assert {pool.pick().label for _ in range(4)} == {"a"}  # type: ignore[union-attr]
    a.health.failed(time.monotonic(), "down")  # b, the one healthy member, is full
    assert pool.pick() is None  # serve() waits for b rather than try a broken member
    b.health.failed(time.monotonic(), "down")  # none healthy: fail open
    assert pool.pick() in (a, c)  # an unhealthy member rather than a certain error
    assert pool.pick(fail_open=False) is None  # a retry wants a healthy one


def test_health_needs_the_probe_to_come_back_or_the_cooldown_without_one() -> None:
    probed = Health(cooldown=1.0, probing=True)
    probed.failed(100.0, "refused")
    assert probed.state is HealthState.UNHEALTHY and not probed.usable(200.0)
    probed.probe_ok(201.0)
    assert probed.usable(201.0)
    unprobed = Health(cooldown=1.0, probing=False)
    unprobed.failed(100.0, "refused")
    assert not unprobed.usable(100.5) and unprobed.usable(101.0)
    assert unprobed.last_error == "refused"
    stats = Stats()
    stats.error(Failure.TIMEOUT)
    assert stats.errors[Failure.TIMEOUT] == 1 and stats.errors[Failure.CONNECT] == 0


def test_a_config_built_in_code_may_hold_only_upstreams() -> None:
    entry = UpstreamEntry.model_validate({"aliases": ["x"], "upstream": {"url": "http://h"}})
    config = Config(upstreams=[entry])
    assert config.aliases() == ["x"] and not config.is_local("x")
    with pytest.raises(ValueError, match="at least one entry"):
        Config()
