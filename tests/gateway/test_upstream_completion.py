"""llama.cpp's POST /completion through the backend seam, as /v1's routes: an upstream entry
forwards it to the server's root, and a pool balances it between that server and a local member.

The backend is a real gateway serving a tiny GGUF on a loopback port; the expectation is what it
answers to the same request sent to it directly (greedy: the same file gives the same tokens),
and X-Modelyard-Backend says which member served.
"""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.apps import Apps
from tests.support.ggufgen import write_tiny_llama

GREEDY = {"n_predict": 12, "temperature": 0, "ignore_eos": True, "prompt": "The quick brown"}


class Servers:
    """A backend gateway and a front one routing to it; `apps` stops them, the front first."""

    def __init__(self, apps: Apps) -> None:
        model = write_tiny_llama(apps.folder / "tiny.gguf", seed=8, n_ctx_train=1024)
        self.backend = apps.serve({"models": [
            {"model": str(model), "aliases": ["tiny"], "n_ctx": 512}]})
        self.front = apps.serve({"models": [
            {"model": str(model), "aliases": ["tiny-local"], "n_ctx": 512},
            {"aliases": ["direct"], "upstream": {"url": self.backend.url + "/v1", "model": "tiny",
                                                 "name": "b1"}},
            {"aliases": ["pool"], "balance": "round_robin",
             "upstream": [{"url": self.backend.url + "/v1", "model": "tiny", "name": "b1-pool"},
                          {"local": "tiny-local"}]},
        ]})


@pytest.fixture(scope="module")
def servers(module_apps: Apps) -> Servers:
    return Servers(module_apps)


def _completion(url: str, **body: Any) -> httpx.Response:
    r = httpx.post(url + "/completion", json={**GREEDY, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_completion_goes_upstream_to_the_servers_root(servers: Servers) -> None:
    direct = _completion(servers.backend.url, model="tiny").json()
    assert direct["tokens_predicted"] == 12 and direct["content"]
    r = _completion(servers.front.url, model="direct")
    assert r.headers["x-modelyard-backend"] == "b1"
    got = r.json()
    assert got["content"] == direct["content"]
    assert got["generation_settings"]["model"] == "tiny"  # the backend's alias: it answered


def test_a_pool_serves_completion_on_each_member(servers: Servers) -> None:
    expected = _completion(servers.backend.url, model="tiny").json()["content"]
    served: dict[str, dict[str, Any]] = {}
    for _ in range(2):  # round_robin: each member once
        r = _completion(servers.front.url, model="pool")
        served[r.headers["x-modelyard-backend"]] = r.json()
    assert set(served) == {"b1-pool", "local:tiny-local"}
    assert all(body["content"] == expected for body in served.values())
    assert served["local:tiny-local"]["model"] == "pool"  # a local member answers as the pool


def test_a_completion_stream_is_relayed_from_upstream(servers: Servers) -> None:
    expected = _completion(servers.backend.url, model="tiny").json()["content"]
    with httpx.stream("POST", servers.front.url + "/completion", timeout=60,
                      json={**GREEDY, "model": "direct", "stream": True}) as r:
        assert r.status_code == 200 and r.headers["x-modelyard-backend"] == "b1"
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert "".join(e["content"] for e in events if not e["stop"]) == expected
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 12
