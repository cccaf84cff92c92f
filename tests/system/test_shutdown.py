"""SIGTERM/SIGINT drain (gateway/shutdown.py) and start-up failures, on `modelyard serve` in a
child process."""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.ggufgen import TINY_SPECIAL, write_tiny_llama
from tests.support.servers import ServerProcess

N_STREAMS = 8
N_TOKENS = 900


def _serve(tmp_path: Path, **top: Any) -> ServerProcess:
    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=8, n_ctx_train=1024)
    config = tmp_path / "modelyard.yaml"
    config.write_text(yaml.safe_dump({**top, "models": [
        {"model": str(model), "aliases": ["tiny"], "n_ctx": 1024, "n_parallel": N_STREAMS}]}))
    return ServerProcess(config, tmp_path / "server.log").wait_ready()


class Stream(threading.Thread):
    """One streaming chat request of `N_TOKENS` tokens, read to its end."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.events: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": N_TOKENS, "stream": True, "logit_bias": TINY_SPECIAL,
                "stream_options": {"include_usage": True}}
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body,
                              timeout=120) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def completion_tokens(self) -> int:
        usage = [json.loads(e)["usage"] for e in self.events[:-1] if '"usage":{' in e]
        return int(usage[-1]["completion_tokens"]) if usage else 0


def _start_streams(server: ServerProcess) -> list[Stream]:
    streams = [Stream(server.url) for _ in range(N_STREAMS)]
    for s in streams:
        s.start()
    deadline = time.monotonic() + 60
    while not all(len(s.events) > 3 for s in streams):  # every stream is generating
        assert time.monotonic() < deadline, "streams did not start"
        time.sleep(0.01)
    return streams


@pytest.mark.slow
def test_streams_finish_after_sigterm_while_health_says_stopping(tmp_path: Path) -> None:
    server = _serve(tmp_path)
    try:
        streams = _start_streams(server)
        server.signal(signal.SIGTERM)
        health, refused = [], []
        while any(s.is_alive() for s in streams):
            try:
                r = httpx.get(server.url + "/health", timeout=5)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                break  # the listener closes once the last stream has ended: before this request
                #        connects, or after it connected but before it was answered
            health.append((r.status_code, r.json()["status"]))
            if not refused:
                r = httpx.post(server.url + "/v1/chat/completions", timeout=5, json={
                    "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
                refused.append((r.status_code, r.headers.get("Retry-After")))
            time.sleep(0.05)
        assert len(health) > 5 and set(health) == {(503, "stopping")}
        assert refused[0][0] == 503 and int(refused[0][1]) >= 1
        for s in streams:
            s.join(30)
            assert s.error is None, s.error
            assert s.events[-1] == "[DONE]" and s.completion_tokens() == N_TOKENS
        assert server.wait(30) == 0
        log = server.log()
        assert "waiting for 8 requests (tiny: 8)" in log and "stopped" in log
    finally:
        server.close()


@pytest.mark.slow
def test_at_the_shutdown_timeout_running_streams_get_an_error_event_and_done(
        tmp_path: Path) -> None:
    server = _serve(tmp_path, shutdown_timeout="300ms")
    try:
        streams = _start_streams(server)
        server.signal(signal.SIGTERM)
        for s in streams:
            s.join(30)
        assert server.wait(30) == 0
        for s in streams:
            assert s.error is None, s.error
            assert s.events[-1] == "[DONE]"
            error = json.loads(s.events[-2])["error"]
            assert "shutting down" in error["message"]
        assert "shutdown_timeout (0.3s) reached with 8 requests" in server.log()
    finally:
        server.close()


@pytest.mark.slow
def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    server = _serve(tmp_path, shutdown_timeout="60s")
    try:
        streams = _start_streams(server)
        server.signal(signal.SIGINT)
        time.sleep(0.2)
        assert httpx.get(server.url + "/health", timeout=5).status_code == 503
        start = time.monotonic()
        server.signal(signal.SIGINT)
        assert server.wait(30) == 0 and time.monotonic() - start < 10
        for s in streams:
            s.join(10)
            assert s.events[-1] == "[DONE]" and "shutting down" in s.events[-2]
    finally:
        server.close()


def test_a_pinned_model_that_cannot_load_fails_the_start_with_status_2(tmp_path: Path) -> None:
    # a valid file the config accepts, whose KV cache for this n_ctx cannot fit the budget
    big = write_tiny_llama(tmp_path / "big.gguf", seed=9, n_ctx_train=1 << 20)
    fine = write_tiny_llama(tmp_path / "fine.gguf", seed=10)
    config = tmp_path / "modelyard.yaml"
    config.write_text(yaml.safe_dump({"registry": {"memory_budget": "256MiB"}, "models": [
        {"model": str(fine), "aliases": ["fine"], "pinned": True, "n_ctx": 128},
        {"model": str(big), "aliases": ["big"], "pinned": True, "n_ctx": 1 << 20}]}))
    server = ServerProcess(config, tmp_path / "server.log")
    try:
        assert server.wait(60) == 2
        log = server.log()
        assert "cannot start: pinned model big cannot load" in log
        assert "memory_budget" in log
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + "/health", timeout=1)
    finally:
        server.close()
