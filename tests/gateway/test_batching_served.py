"""Continuous batching served over HTTP (SmolLM2; the runner itself: tests/engine/test_batching.py):
a short request behind a long prompt, prompt progress, cached tokens in usage, n > 1."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.apps import Apps
from tests.support.batch_checks import CHAT_PROMPTS as PROMPTS
from tests.support.sse import sse_data


@pytest.fixture(scope="module")
def server(module_apps: Apps, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory):
    from tests.support.servers import write_config

    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [{"model": str(smollm2_path), "aliases": ["smollm2"], "n_ctx": 2048,
                    "n_parallel": 4}],
    })
    return module_apps.serve(config)



def stream_chat(url: str, body: dict[str, Any], events: list[tuple[float, dict[str, Any]]]) -> None:
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=120) as r:
        r.raise_for_status()
        for data in sse_data(r):
            if data != "[DONE]":
                events.append((time.perf_counter(), json.loads(data)))


def test_short_request_behind_a_long_prompt_gets_its_first_token_while_that_prompt_is_read(server):
    # an order of events, not a wall-clock bound (timings live in scripts/bench_serve.py): the
    # short request's first token arrives before the long prompt has been read to its end
    words = "The history of the river valley is long and full of small stories. "
    long_text = words * 110
    long_events: list[tuple[float, dict[str, Any]]] = []
    long_body = {"model": "smollm2", "messages": [{"role": "user", "content": long_text}],
                 "max_tokens": 4, "temperature": 0}
    reader = threading.Thread(target=stream_chat, args=(server.url, long_body, long_events))
    reader.start()
    deadline = time.monotonic() + 60
    while not any("prompt_progress" in e for _, e in long_events):
        assert time.monotonic() < deadline and reader.is_alive()
        time.sleep(0.005)
    total = next(e for _, e in long_events if "prompt_progress" in e)["prompt_progress"]["total"]
    assert total >= 1500
    short_events: list[tuple[float, dict[str, Any]]] = []
    sent = time.perf_counter()
    stream_chat(server.url, {"model": "smollm2", "messages": [{"role": "user", "content": "Hi!"}],
                             "max_tokens": 3, "temperature": 0}, short_events)
    first = next(t for t, e in short_events if e["choices"] and e["choices"][0]["delta"].get("content"))
    reader.join(120)
    progress = [(t, e["prompt_progress"]["processed"]) for t, e in long_events if "prompt_progress" in e]
    print(f"first token of a short request behind a {total}-token prompt: {first - sent:.3f} s")
    still_reading = [p for t, p in progress if t > first]
    assert still_reading and still_reading[0] < total  # the long prompt was still being read
    assert [p for _, p in progress] == sorted(p for _, p in progress) and progress[-1][1] == total
    assert all(e["choices"][0]["delta"] == {} for _, e in long_events if "prompt_progress" in e)


def test_cached_tokens_in_usage_for_the_next_turn(server):
    client = server.client
    messages = [{"role": "user", "content": "Name a colour of the rainbow."}]
    first = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8,
                                           temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Another one?"}]
    second = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8,
                                            temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens < cached < second.usage.prompt_tokens


def test_n_choices_stream_side_by_side(server):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell me a fun fact."}],
            "max_tokens": 16, "temperature": 0.8, "seed": 5, "n": 3,
            "stream_options": {"include_usage": True}}
    events: list[tuple[float, dict[str, Any]]] = []
    stream_chat(server.url, body, events)
    chunks = [e for _, e in events]
    order = [c["choices"][0]["index"] for c in chunks
             if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert set(order) == {0, 1, 2}
    first_finish = min(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["finish_reason"])
    seen_before = {c["choices"][0]["index"] for c in chunks[:first_finish]
                   if c["choices"] and c["choices"][0]["delta"].get("content")}
    assert seen_before == {0, 1, 2}                      # interleaved, not one after another
    whole = server.client.chat.completions.create(**{k: v for k, v in body.items() if k != "stream_options"})
    for i in range(3):
        streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks
                           if c["choices"] and c["choices"][0]["index"] == i)
        assert streamed == whole.choices[i].message.content
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == whole.usage.completion_tokens
    assert usage["prompt_tokens"] == whole.usage.prompt_tokens
    # billed once per prompt: the first run read the new part of it once (the other choices
    # copied it); the second found all of it but the last token in a slot
    assert usage["prompt_tokens_details"]["cached_tokens"] < whole.usage.prompt_tokens - 1
    assert whole.usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1


@pytest.mark.slow
def test_concurrent_clients_get_what_they_would_alone(server):
    client = server.client
    asks = PROMPTS[:6]
    alone_replies = [client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": a}], max_tokens=16, temperature=0,
        logit_bias={"0": -100, "2": -100, "4": -100}).choices[0].message.content for a in asks]
    replies: dict[int, str] = {}

    def ask(i: int) -> None:
        r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": asks[i]}],
                                           max_tokens=16, temperature=0,
                                           logit_bias={"0": -100, "2": -100, "4": -100})
        replies[i] = r.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [replies[i] for i in range(len(asks))] == alone_replies
