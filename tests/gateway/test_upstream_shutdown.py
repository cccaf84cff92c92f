"""At the shutdown deadline a stream relayed from an upstream ends as a local one does (issue
#33): an error event saying the server is stopping, then `[DONE]`, and the upstream connection
closes, so the drain does not wait on a server that keeps talking."""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.shutdown import Phase, Shutdown
from tests.support.apps import Apps

CHUNK_SECONDS = 0.1
N_CHUNKS = 600  # a minute of chunks: far longer than the test waits


class SlowUpstream:
    """An OpenAI-compatible server whose chat streams send a chunk every CHUNK_SECONDS; it
    notes when a stream's client (the gateway) went away."""

    def __init__(self) -> None:
        self.disconnected = threading.Event()
        self.app = Starlette(routes=[Route("/v1/models", self.models),
                                     Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": []})

    async def chat(self, request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                for i in range(N_CHUNKS):
                    delta = {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
                    yield b"data: " + json.dumps(delta).encode() + b"\n\n"
                    await asyncio.sleep(CHUNK_SECONDS)
                yield b"data: [DONE]\n\n"
            finally:
                self.disconnected.set()
        return StreamingResponse(chunks(), media_type="text/event-stream")


def test_a_relayed_stream_ends_at_the_shutdown_deadline(apps: Apps) -> None:
    slow = SlowUpstream()
    upstream = apps.host(slow.app)
    front = apps.serve({"shutdown_timeout": "300ms", "models": [
        {"aliases": ["remote"], "upstream": {"url": upstream.url + "/v1"}}]},
        ready_path="/health")
    events: list[str] = []
    first = threading.Event()

    def read() -> None:
        body = {"model": "remote", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", front.url + "/v1/chat/completions", json=body,
                          timeout=30) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first.wait(10), "the relay sent nothing"

    async def signal() -> Shutdown:
        shutdown = Shutdown(front.app, 0.3)
        shutdown.signal("SIGTERM")
        return shutdown

    shutdown = front.on_loop(signal())
    front.on_loop(asyncio.wait_for(shutdown.wait(), 10), timeout=15)
    reader.join(5)
    assert not reader.is_alive(), "the relayed stream went on past the deadline"
    assert shutdown.phase is Phase.STOPPING
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "shutting down" in error["message"] and error["code"] == "server_busy"
    assert all(json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-2])
    assert len(events) - 2 < N_CHUNKS  # cut, not finished
    assert slow.disconnected.wait(5), "the upstream connection stayed open"
