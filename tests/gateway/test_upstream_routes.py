"""Upstream entries forward every route: /v1/* paths modelyard does not serve, llama.cpp's
/rerank, Anthropic's and Ollama's paths reach the upstream's server as received, and its
answer (an NDJSON stream too) comes back as sent. Without an upstream alias in the body, an
unserved path stays a 404 (or a 405 where another method serves it)."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.app import create_app
from gateway.config import load_config
from tests.support.ggufgen import write_tiny_llama
from tests.support.servers import ThreadedServer


class Recorder:
    """Answers every POST with what it received; /api/chat as an NDJSON stream."""

    def __init__(self) -> None:
        self.received: list[tuple[str, bytes]] = []
        self.app = Starlette(routes=[
            Route("/v1/models", self.models), Route("/health", self.health),
            Route("/{path:path}", self.echo, methods=["POST"])])

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": []})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def echo(self, request: Request) -> Response:
        body = await request.body()
        self.received.append((request.url.path, body))
        if request.url.path == "/api/chat":
            return StreamingResponse(self._lines(), media_type="application/x-ndjson")
        return JSONResponse({"path": request.url.path})

    async def _lines(self) -> AsyncIterator[bytes]:
        for i in range(3):
            yield json.dumps({"message": {"content": str(i)}, "done": i == 2}).encode() + b"\n"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Recorder, str]]:
    d = tmp_path_factory.mktemp("routes")
    recorder = Recorder()
    upstream = ThreadedServer(recorder.app)
    upstream.start_serving()
    config = d / "front.yaml"
    config.write_text(yaml.safe_dump({"models": [
        {"aliases": ["far"], "upstream": {"url": upstream.url}},
        {"aliases": ["near"], "model": str(write_tiny_llama(d / "tiny.gguf")), "n_ctx": 128}]}))
    front = ThreadedServer(create_app(load_config(config)))
    front.ready_path = "/health"
    front.start_serving()
    try:
        yield recorder, front.url
    finally:
        front.stop()
        upstream.stop()


@pytest.mark.parametrize(("path", "upstream_path"), [
    ("/v1/rerank", "/v1/rerank"),
    ("/v1/audio/transcriptions", "/v1/audio/transcriptions"),
    ("/rerank", "/rerank"),
    ("/v1/messages", "/v1/messages"),
    ("/api/generate", "/api/generate"),
    ("/api/embed", "/api/embed"),
])
def test_an_upstream_alias_gets_the_route_as_received(servers: tuple[Recorder, str], path: str,
                                                      upstream_path: str) -> None:
    recorder, url = servers
    raw = b'{"model": "far",  "query": "q", "documents": ["a", "b"], "odd": [1]}'
    r = httpx.post(url + path, content=raw, timeout=10,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json() == {"path": upstream_path}
    assert recorder.received[-1] == (upstream_path, raw)


def test_an_ollama_stream_comes_back_line_by_line(servers: tuple[Recorder, str]) -> None:
    _, url = servers
    with httpx.stream("POST", url + "/api/chat", timeout=10, json={
            "model": "far", "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [line["message"]["content"] for line in lines] == ["0", "1", "2"]
    assert lines[-1]["done"] is True


@pytest.mark.parametrize(("path", "status"), [
    ("/v1/audio/transcriptions", 404),  # served by no route here, and the model is local
    ("/v1/rerank", 400),          # served here (#32): a body without documents is a 400
    ("/rerank", 400),
    ("/v1/models", 405),          # served, by GET
])
def test_without_an_upstream_alias_unserved_routes_answer_as_before(
        servers: tuple[Recorder, str], path: str, status: int) -> None:
    _, url = servers
    body: dict[str, Any] = {"model": "near", "query": "q"}
    assert httpx.post(url + path, json=body, timeout=10).status_code == status


@pytest.mark.parametrize(("path", "status"), [
    ("/v1/nothing-here", 404), ("/v1/chat/completions", 405), ("/rerank", 405)])
def test_other_methods_answer_as_before(servers: tuple[Recorder, str], path: str,
                                        status: int) -> None:
    _, url = servers
    assert httpx.get(url + path, timeout=10).status_code == status
