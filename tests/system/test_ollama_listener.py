"""`ollama_address`: `modelyard serve` answering on a second address (Ollama's port, for clients
wired to it) with the same app: one registry, the same routes, the same keys. Judged through
ollama-python's client on the second port and plain HTTP on the first, as a child process
(tests/support/servers.py's ServerProcess) so the real start-up binds both sockets.
"""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import ollama
import pytest
import yaml

from tests.support.ggufgen import write_tiny_llama
from tests.support.paths import REPO
from tests.support.servers import ServerProcess, free_port


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf")


def config(path: Path, model: Path, **top: object) -> Path:
    path.write_text(yaml.safe_dump({**top, "models": [
        {"model": str(model), "aliases": ["tiny"], "n_ctx": 128}]}))
    return path


def test_the_second_port_serves_the_same_app(tmp_path: Path, tiny: Path) -> None:
    ollama_port = free_port()
    server = ServerProcess(config(tmp_path / "c.yaml", tiny,
                                  ollama_address=f"127.0.0.1:{ollama_port}"), tmp_path / "log")
    try:
        server.wait_ready()
        assert f"also on http://127.0.0.1:{ollama_port}" in server.log()
        client = ollama.Client(host=f"http://127.0.0.1:{ollama_port}", timeout=60)
        assert client._client.get("/").text == "Ollama is running"
        assert [m.model for m in client.list().models] == ["tiny:latest"]
        reply = client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                            options={"num_predict": 3, "temperature": 0}, stream=False)
        assert reply.done and reply.eval_count == 3
        # one app: the model the second port loaded is loaded on the first
        ps = httpx.get(server.url + "/api/ps", timeout=10).json()["models"]
        assert [m["model"] for m in ps] == ["tiny:latest"]
        both = [httpx.get(base + "/v1/models", timeout=10).json()
                for base in (server.url, f"http://127.0.0.1:{ollama_port}")]
        assert both[0] == both[1]
    finally:
        server.close()


def serve(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(path),
                           "--port", str(free_port()), "--no-watch"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)


def test_an_exposed_second_address_needs_a_key(tmp_path: Path, tiny: Path) -> None:
    done = serve(config(tmp_path / "c.yaml", tiny, ollama_address=f"0.0.0.0:{free_port()}"))
    assert done.returncode == 2
    assert "ollama_address: refusing to listen on 0.0.0.0" in done.stderr


def test_a_taken_second_port_is_one_line_and_status_2(tmp_path: Path, tiny: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve(config(tmp_path / "c.yaml", tiny, ollama_address=str(port)))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "in use" in done.stderr and f":{port}" in done.stderr


def test_a_bad_address_is_a_config_error_naming_the_key(tmp_path: Path, tiny: Path) -> None:
    done = serve(config(tmp_path / "c.yaml", tiny, ollama_address="localhost:http"))
    assert done.returncode == 2
    assert "ollama_address" in done.stderr and "HOST:PORT" in done.stderr
