"""Soak: 500 requests from 16 clients over two tiny models that cannot both stay loaded.

Random aliases, endpoints, streaming or not, n, temperature, max_tokens and prompt lengths, and a
quarter of the streams dropped mid-way by the client. max_loaded_models: 1 makes the registry swap
the models all the time. Afterwards nothing may be left counted: /admin/models shows no request
in flight or queued and the loaded model's scheduler holds no slot; the process's memory must
not have grown (under 10% between the first and the last 100 requests).
"""
from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from gguf import GGMLQuantizationType

from gateway.state import app_state
from tests.support.apps import Apps
from tests.support.ggufgen import SAMPLE, write_tiny_llama
from tests.support.servers import rss_bytes, write_config
from tests.support.sse import sse_data

pytestmark = pytest.mark.slow

N_CLIENTS = 16
N_REQUESTS = 500
ALIASES = ["tiny-a", "tiny-a2", "tiny-b", "tiny-b2"]
WORDS = SAMPLE.split()


@pytest.fixture(scope="module")
def server(module_apps: Apps, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("soak")
    a = write_tiny_llama(d / "a.gguf", qtype=GGMLQuantizationType.Q8_0, seed=11)
    b = write_tiny_llama(d / "b.gguf", qtype=GGMLQuantizationType.Q4_0, seed=12)
    config = write_config(d / "modelyard.yaml", {
        "registry": {"max_loaded_models": 1, "load_timeout": "120s"},
        "models": [
            {"model": str(a), "aliases": ["tiny-a", "tiny-a2"], "n_ctx": 512, "n_parallel": 4},
            {"model": str(b), "aliases": ["tiny-b", "tiny-b2"], "n_ctx": 512, "n_parallel": 4},
        ],
    })
    return module_apps.serve(config)


class Tally:
    """What every client saw, shared between the client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.rss: list[int] = []          # after each request, in completion order
        self.tokens = 0

    def done(self, outcome: str, tokens: int = 0, error: str | None = None) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            self.tokens += tokens
            if error is not None:
                self.errors.append(error)
            self.rss.append(rss_bytes())


def one_request(client: httpx.Client, rng: random.Random, tally: Tally) -> None:
    alias = rng.choice(ALIASES)
    chat = rng.random() < 0.7
    stream = rng.random() < 0.6
    n = 2 if rng.random() < 0.2 else 1
    max_tokens = rng.randint(1, 48)
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 120)))
    body: dict[str, Any] = {"model": alias, "max_tokens": max_tokens, "n": n, "stream": stream,
                            "temperature": rng.choice([0.0, 0.7, 1.0]), "seed": rng.randint(0, 99)}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    path = "/v1/chat/completions" if chat else "/v1/completions"
    hang_up = rng.randint(1, 6) if stream and rng.random() < 0.25 else None
    what = f"{path} {alias} n={n} max_tokens={max_tokens} stream={stream}"
    if not stream:
        r = client.post(path, json=body)
        if r.status_code != 200:
            tally.done("error", error=f"{what}: {r.status_code} {r.text[:200]}")
            return
        data = r.json()
        bad = [c for c in data["choices"] if c["finish_reason"] not in ("stop", "length")]
        usage = data["usage"]
        if len(data["choices"]) != n or bad or usage["completion_tokens"] > n * max_tokens:
            tally.done("error", error=f"{what}: malformed {data}")
            return
        tally.done("whole", usage["completion_tokens"])
        return
    with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            tally.done("error", error=f"{what}: {r.status_code} {r.read()[:200]!r}")
            return
        events = 0
        finished: set[int] = set()
        tokens = 0
        last = ""
        for events, data in enumerate(sse_data(r), start=1):  # noqa: B007 - counted for after the loop
            last = data
            if hang_up is not None and events >= hang_up:
                tally.done("hung up")
                return                    # leaving the block closes the connection mid-stream
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                tally.done("error", error=f"{what}: {chunk}")
                return
            for choice in chunk["choices"]:
                if choice.get("finish_reason"):
                    finished.add(choice["index"])
                tokens += bool(choice.get("delta", {}).get("content") or choice.get("text"))
    if last != "[DONE]" or finished != set(range(n)):
        tally.done("error", error=f"{what}: stream ended early ({last!r}, finished {finished})")
        return
    tally.done("streamed", tokens)


def test_soak_many_clients_two_models_one_loaded(server):
    tally = Tally()
    counter = iter(range(N_REQUESTS))
    counter_lock = threading.Lock()
    give_up = threading.Event()

    def client_loop(number: int) -> None:
        rng = random.Random(number)
        with httpx.Client(base_url=server.url, timeout=120) as client:
            while not give_up.is_set():
                with counter_lock:
                    if next(counter, None) is None:
                        return
                try:
                    one_request(client, rng, tally)
                except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
                    tally.done("error", error=f"client {number}: {type(exc).__name__}: {exc}")

    started = time.monotonic()
    clients = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(N_CLIENTS)]
    for t in clients:
        t.start()
    while any(t.is_alive() for t in clients):
        time.sleep(0.2)
        elapsed = time.monotonic() - started
        if (elapsed > 30 and not tally.rss) or elapsed > 240:
            give_up.set()
            loads = {a: r["load_count"] for a, r in server.snapshot().items()}
            pytest.fail(f"{len(tally.rss)} of {N_REQUESTS} requests done after {elapsed:.0f} s; "
                        f"loads so far {loads} (models swapping without serving anyone?)")
    seconds = time.monotonic() - started

    # nothing left counted once the last hang-up has been noticed
    deadline = time.monotonic() + 20
    while True:
        rows = httpx.get(server.url + "/admin/models", timeout=10).json()["data"]
        busy = [r for r in rows if r["in_flight"] or r["queued"]]
        if not busy:
            break
        assert time.monotonic() < deadline, f"leaked: {busy}"
        time.sleep(0.1)
    snapshot = server.snapshot()
    active = {alias: app_state(server.app).registry._slots[alias].model.scheduler.active
              for alias, row in snapshot.items() if row["state"] == "ready"}
    loads = {alias: row["load_count"] for alias, row in snapshot.items()}
    first = statistics.median(tally.rss[:100])
    last = statistics.median(tally.rss[-100:])
    print(f"\nsoak: {N_REQUESTS} requests in {seconds:.1f} s, outcomes {dict(tally.outcomes)}, "
          f"{tally.tokens} streamed/generated tokens, loads {loads}, "
          f"RSS median first 100 {first / 2**20:.1f} MiB, last 100 {last / 2**20:.1f} MiB "
          f"({(last - first) / first:+.1%})")
    assert tally.errors == [], "\n".join(tally.errors[:10])
    assert sum(tally.outcomes.values()) == N_REQUESTS
    assert tally.outcomes["hung up"] > 20 and tally.outcomes["whole"] > 50
    assert sum(loads.values()) > 4, "the two models were expected to swap"
    assert all(n == 0 for n in active.values()), active
    assert last < 1.10 * first
    # still serving: every alias answers
    for alias in ALIASES:
        r = httpx.post(server.url + "/v1/completions", timeout=60,
                       json={"model": alias, "prompt": "the end", "max_tokens": 2})
        assert r.status_code == 200, r.text
