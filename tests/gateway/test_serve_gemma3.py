"""Gemma 3 270M served beside SmolLM2 from one config, with SmolLM2's batching guarantees.

Part 1 (engine): a Gemma 3 sequence's tokens do not depend on its company in the batch, also
past the ring of its sliding-window layers (n_ctx 2048, ring 1023 rows); the independent
expectation is the engine's one-sequence path (Model.stream). Part 2 (HTTP): both models from
one config, streaming, n > 1, concurrent clients of both families get what they would alone.
Gemma 3's file has no chat template, so it is driven through /v1/completions.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

import engine
from engine.batch import BatchRunner, Sequence
from engine.sampling import SamplingParams
from tests.support.apps import Apps
from tests.support.batch_checks import alone, assert_same_or_near_tie, run_all
from tests.support.sse import sse_data

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "Three things to pack for a hike:",
    "The best way to learn a language is",
    "In 1969, the first people to walk on the Moon",
]
N_NEW = 20


@pytest.fixture(scope="module")
def gemma(gemma3_path: Path):
    model = engine.load(gemma3_path, n_ctx=2048, n_threads=2, n_slots=6)
    yield model
    model.close()


def prompt_ids(model: Any, text: str) -> list[int]:
    return [model.tokenizer.bos_id, *model.tokenizer.encode(text)]


def test_greedy_tokens_do_not_depend_on_the_batch(gemma):
    prompts = [prompt_ids(gemma, t) for t in PROMPTS]
    expected = [alone(gemma, ids, GREEDY, N_NEW) for ids in prompts]
    runner = BatchRunner(gemma, prefill_budget=24)
    seqs = [Sequence(ids, params=GREEDY, max_tokens=N_NEW, stop_at_eog=False) for ids in prompts]
    for seq in seqs[:2]:
        runner.submit(seq)
    sizes = []
    for i in range(1000):
        if i == 2:
            for seq in seqs[2:]:
                runner.submit(seq)
        if not runner.busy:
            break
        sizes.append(runner.step().n_sequences)
    runner.close()
    assert max(sizes) == 6
    for ids, want, seq in zip(prompts, expected, seqs):
        assert_same_or_near_tie(gemma, ids, want, seq.generated)


def test_seeded_sampling_is_reproducible_per_request(gemma):
    prompts = [prompt_ids(gemma, t) for t in PROMPTS]
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=7 + i) for i in range(6)]
    expected = [alone(gemma, ids, p, N_NEW) for ids, p in zip(prompts, params)]
    runner = BatchRunner(gemma)
    seqs = [Sequence(ids, params=p, max_tokens=N_NEW, stop_at_eog=False)
            for ids, p in zip(prompts, params)]
    for seq in reversed(seqs):
        runner.submit(seq)
    run_all(runner)
    runner.close()
    assert [s.generated for s in seqs] == expected


def test_a_batch_past_the_ring_gives_the_tokens_of_a_lone_sequence(gemma):
    """A prompt longer than the local layers' ring (1023 rows), read in budgeted chunks beside a
    short one, and a second request sharing its prefix (copy_prefix of a wrapped ring)."""
    words = ("The river valley has a long history, full of small stories about farmers, "
             "travellers and the weather. ")
    long_ids = prompt_ids(gemma, words * 80)[:1300]
    assert len(long_ids) == 1300 and gemma.transformer.cache.layout.groups[1].ring == 1023
    want = alone(gemma, long_ids, GREEDY, 12)
    runner = BatchRunner(gemma, prefill_budget=128)
    seqs = [Sequence(long_ids, params=GREEDY, max_tokens=12, stop_at_eog=False),
            Sequence(prompt_ids(gemma, PROMPTS[0]), params=GREEDY, max_tokens=12, stop_at_eog=False),
            Sequence(long_ids, params=GREEDY, max_tokens=12, stop_at_eog=False)]
    for seq in seqs:
        runner.submit(seq)
    run_all(runner)
    runner.close()
    assert seqs[0].generated == want and seqs[2].generated == want
    assert seqs[2].cached == len(long_ids) - 1  # the copy took the whole prompt but one token


# ------------------------------------------------------------------ part 2: served over HTTP

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
