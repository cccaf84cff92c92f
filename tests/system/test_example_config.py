"""examples/config.yaml works when run the way its own header says, after the quick start (the
default model in the cache): the server starts, both entries answer, the pinned one loaded at
start-up with its template file and context. The cache holds a tiny stand-in named like the
default model (MODELYARD_CACHE; its kernel folder is the usual one, so nothing recompiles)."""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from engine.default_model import FILENAME, cache_root
from tests.support.ggufgen import write_tiny_llama
from tests.support.paths import REPO
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.slow
EXAMPLE = REPO / "examples" / "config.yaml"


def test_the_header_says_how_to_run_it() -> None:
    header = [line for line in EXAMPLE.read_text().splitlines() if line.startswith("#")]
    assert any(re.search(r"Run with: modelyard serve --config examples/config\.yaml$", line)
               for line in header)


def test_it_serves_as_its_header_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = cache_root() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "kernels").symlink_to(kernels)
    write_tiny_llama(cache / FILENAME)
    monkeypatch.setenv("MODELYARD_CACHE", str(cache))
    server = ServerProcess(EXAMPLE, tmp_path / "log.txt")
    try:
        server.wait_ready(timeout=300)
        models = httpx.get(server.url + "/admin/models", timeout=10).json()
        rows = {m["aliases"][0]: m for m in models["data"] if m.get("kind") == "local"}
        assert rows["smol-long"]["state"] == "ready" and rows["smol-long"]["n_ctx"] == 8192
        assert rows["smol-long"]["chat_format"].startswith("config template")  # the file
        for alias in ("smol", "gpt-3.5-turbo", "smol-long"):
            r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
                "model": alias, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
    finally:
        server.close()
