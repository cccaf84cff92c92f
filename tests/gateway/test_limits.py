"""Request limits (gateway/http/limits.py, config `limits`): body size, body read timeout, prompt size."""
from __future__ import annotations

import select
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.support.apps import Apps
from tests.support.ggufgen import TINY_SPECIAL, write_tiny_llama
from tests.support.servers import Server, write_config

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(module_apps: Apps, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("limits")
    model = write_tiny_llama(d / "tiny.gguf", seed=3)
    config = write_config(d / "modelyard.yaml", {
        "limits": {"max_body": "1MiB", "body_timeout": "1s", "max_prompt": "200KiB"},
        "models": [{"model": str(model), "aliases": ["tiny"], "n_ctx": 128}],
    })
    return module_apps.serve(config)


def _raw(server: Server, head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(head)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_body_announced_over_the_limit_gets_413_before_it_is_sent(server: Server) -> None:
    sock = _raw(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 67108864\r\n\r\n")
    start = time.monotonic()
    reply = _read_all(sock)  # the server answers and closes without waiting for 64 MiB
    assert time.monotonic() - start < 1.0
    assert reply.startswith(b"HTTP/1.1 413") and b"limits.max_body" in reply
    sock.close()


def test_a_64_mib_body_gets_413_fast(server: Server) -> None:
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"x" * (64 * MiB)
    start = time.monotonic()
    r = httpx.post(server.url + "/v1/chat/completions", content=body, timeout=10,
                   headers={"Content-Type": "application/json"})
    assert time.monotonic() - start < 1.0
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(server: Server) -> None:
    def chunks():
        for _ in range(64):
            yield b"x" * (256 * 1024)

    r = httpx.post(server.url + "/v1/completions", content=chunks(), timeout=10)
    assert r.status_code == 413 and "limits.max_body" in r.json()["error"]["message"]
    # the server is fine afterwards
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_trickled_body_is_dropped_after_the_timeout(server: Server) -> None:
    socks = [_raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: 100000\r\n\r\n{\"prompt\": ") for _ in range(20)]
    replies = dict.fromkeys(socks, b"")
    open_socks = set(socks)
    start = time.monotonic()
    while open_socks and time.monotonic() - start < 10:
        for sock in list(open_socks):
            try:
                sock.sendall(b" ")  # a byte every 50 ms: every read makes progress, slowly
            except OSError:
                pass
        readable, _, _ = select.select(list(open_socks), [], [], 0.05)
        for sock in readable:
            try:
                chunk = sock.recv(65536)
            except OSError:
                chunk = b""
            replies[sock] += chunk
            if not chunk:  # closed by the server
                open_socks.discard(sock)
    elapsed = time.monotonic() - start
    for sock in socks:
        sock.close()
    assert not open_socks, "connections still held open"
    assert elapsed < 4.0  # body_timeout is 1 s for the whole body, however it trickles
    assert all(r.startswith(b"HTTP/1.1 408") for r in replies.values()), next(iter(replies.values()))
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_body_that_lies_about_its_length_is_dropped_too(server: Server) -> None:
    sock = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                        b"\r\n" + b'{"prompt": "hi"}')
    start = time.monotonic()
    reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 408") and 0.8 < time.monotonic() - start < 3.0
    sock.close()


def test_a_prompt_too_long_for_the_context_is_refused_before_tokenizing(server: Server) -> None:
    # 150 000 characters cannot fit 128 tokens of this vocabulary, however they tokenize
    r = httpx.post(server.url + "/v1/completions", timeout=30, json={
        "model": "tiny", "prompt": "a" * 150_000, "max_tokens": 1})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(server.url + "/v1/completions", timeout=30, json={
        "model": "tiny", "prompt": "a" * 300_000, "max_tokens": 1})
    assert r.status_code == 413 and r.json()["error"]["code"] == "prompt_too_large"
    # a prompt that fits still works
    r = httpx.post(server.url + "/v1/completions", timeout=30, json={
        "model": "tiny", "prompt": "hello", "max_tokens": 2, "logit_bias": TINY_SPECIAL})
    assert r.status_code == 200


def test_limits_are_in_the_config_with_defaults(tmp_path: Path) -> None:
    from gateway.config import load_config

    model = write_tiny_llama(tmp_path / "m.gguf")
    config = load_config(write_config(tmp_path / "c.yaml", {"models": [{"model": str(model)}]}))
    assert config.limits.max_body == 32 * MiB
    assert config.limits.template_timeout == 2.0
    assert config.shutdown_timeout == 60.0


def test_llama_cpp_routes_take_the_same_prompt_limits(server: Server) -> None:
    # /completion refuses what /v1/completions refuses, before tokenizing
    r = httpx.post(server.url + "/completion", timeout=30, json={
        "model": "tiny", "prompt": "a" * 150_000, "n_predict": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(server.url + "/completion", timeout=30, json={
        "model": "tiny", "prompt": ["a" * 300_000], "n_predict": 1})
    assert r.status_code == 413 and r.json()["error"]["code"] == "prompt_too_large"
    # /tokenize has no context to fit, only the size cap
    r = httpx.post(server.url + "/tokenize", timeout=30, json={"content": "a" * 150_000})
    assert r.status_code == 200 and len(r.json()["tokens"]) > 128
    r = httpx.post(server.url + "/tokenize", timeout=30, json={"content": "a" * 300_000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "prompt_too_large"
