"""Gemma 3 270M served beside SmolLM2 from one config: both models, streaming, n > 1, and
concurrent clients of both families get what they would alone (batching in the engine alone:
tests/engine/test_batching_gemma3.py). Gemma 3's file has no chat template, so it is driven
through /v1/completions.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.apps import Apps
from tests.support.batch_checks import COMPLETION_PROMPTS as PROMPTS
from tests.support.sse import sse_data

pytestmark = pytest.mark.real_model



@pytest.fixture(scope="module")
def server(module_apps: Apps, smollm2_path: Path, gemma3_path: Path,
           tmp_path_factory: pytest.TempPathFactory):
    from tests.support.servers import write_config

    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [
            {"model": str(smollm2_path), "aliases": ["smollm2"], "n_ctx": 2048, "n_parallel": 3},
            {"model": str(gemma3_path), "aliases": ["gemma3"], "n_ctx": 2048, "n_parallel": 3},
        ],
    })
    return module_apps.serve(config)


def stream_completion(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=120) as r:
        r.raise_for_status()
        return [json.loads(d) for d in sse_data(r) if d != "[DONE]"]


def test_both_models_are_served_from_one_config(server):
    ids = {m.id for m in server.client.models.list().data}
    assert {"smollm2", "gemma3"} <= ids
    g = server.client.completions.create(model="gemma3", prompt=PROMPTS[0], max_tokens=8,
                                         temperature=0)
    s = server.client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi!"}], max_tokens=8, temperature=0)
    assert g.choices[0].text and s.choices[0].message.content
    rows = {r["aliases"][0]: r for r in server.snapshot().values()}
    assert rows["gemma3"]["state"] == "ready" and rows["smollm2"]["state"] == "ready"


def test_gemma_streams_n_choices_side_by_side(server):
    body = {"model": "gemma3", "prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0.8,
            "seed": 3, "n": 3}
    chunks = stream_completion(server.url, body)
    texts = {i: "".join(c["choices"][0]["text"] for c in chunks
                        if c["choices"] and c["choices"][0]["index"] == i) for i in range(3)}
    first_finish = min(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["finish_reason"])
    assert {c["choices"][0]["index"] for c in chunks[:first_finish] if c["choices"]} == {0, 1, 2}
    whole = server.client.completions.create(**body)
    assert [texts[i] for i in range(3)] == [whole.choices[i].text for i in range(3)]


def test_concurrent_clients_of_both_families_get_what_they_would_alone(server):
    client = server.client

    def gemma_reply(i: int) -> str:
        return client.completions.create(model="gemma3", prompt=PROMPTS[i], max_tokens=16,
                                         temperature=0).choices[0].text

    def smol_reply(i: int) -> str:
        return client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=16,
            temperature=0, logit_bias={"0": -100, "2": -100, "4": -100}).choices[0].message.content

    asks = [(gemma_reply, i) for i in range(4)] + [(smol_reply, i) for i in range(3)]
    expected = [fn(i) for fn, i in asks]
    replies: dict[int, str] = {}

    def ask(k: int) -> None:
        fn, i = asks[k]
        replies[k] = fn(i)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [replies[k] for k in range(len(asks))] == expected
