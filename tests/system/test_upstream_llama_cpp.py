"""llama-cpp-python's OpenAI server as an upstream of a front instance (the benchmark peer's build
in /opt/llama-venv; skipped where it is not installed, as in CI)."""
from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.config import Config
from gateway.config.upstream import UpstreamEntry
from tests.support.servers import ThreadedServer, free_port

LLAMA_PYTHON = Path("/opt/llama-venv/bin/python")

pytestmark = [pytest.mark.slow, pytest.mark.real_model,
              pytest.mark.skipif(not LLAMA_PYTHON.exists(),
                                 reason="llama-cpp-python is not installed in /opt/llama-venv")]


@pytest.fixture(scope="module")
def llama_server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = open(tmp_path_factory.mktemp("llama") / "server.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [str(LLAMA_PYTHON), "-m", "llama_cpp.server", "--model", str(smollm2_path),
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--n_threads", "1"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "llama_cpp.server exited"
            try:
                if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama_cpp.server did not start"
            time.sleep(0.1)
        yield url
    finally:
        process.kill()
        process.wait(10)
        log.close()


def _ask(url: str, model: str, stream: bool) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 12, "temperature": 0, "stream": stream}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        raw = r.read().decode()
    if not stream:
        return r.status_code, json.loads(raw)["choices"][0]["message"]["content"]
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return r.status_code, "".join(c["delta"].get("content") or "" for e in events[:-1]
                                  for c in json.loads(e)["choices"])


def test_llama_cpp_python_serves_an_alias_through_the_front(llama_server: str) -> None:
    # one probe at the start: llama-cpp-python answers nothing else while it generates, so a
    # probe during a request would time out and (rightly) mark it unhealthy
    entry = UpstreamEntry.model_validate({"aliases": ["peer"], "probe": {"interval": "10m"},
                                          "upstream": {"url": llama_server,
                                                       "name": "llama-cpp-python"}})
    front = ThreadedServer(create_app(Config(upstreams=[entry])))
    front.start_serving()
    try:
        # llama-cpp-python reuses a prompt it has seen (its numerics then differ from a fresh
        # read): one call first, so the direct and the relayed call both start from the cache
        _ask(llama_server, "peer", False)
        for stream in (False, True):
            direct = _ask(llama_server, "peer", stream)
            through = _ask(front.url, "peer", stream)
            assert direct[0] == through[0] == 200
            assert through[1] == direct[1] and through[1].strip(), stream
        rows = httpx.get(front.url + "/admin/models").json()["data"]
        assert rows[0]["name"] == "llama-cpp-python" and rows[0]["state"] == "healthy"
        assert rows[0]["requests"] == 2 and rows[0]["errors"]["connect"] == 0
    finally:
        front.stop()
