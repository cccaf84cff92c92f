"""The OpenAI API end to end: a real Hypercorn server on a loopback port, the official client.

Models: two tiny random-weight GGUFs written by tests/support/ggufgen.py and the real SmolLM2. Random
models say nothing sensible, so expectations come from elsewhere: the OpenAI schema (the client
parses every response), llama.cpp's reference output for SmolLM2, and consistency between
endpoints (a stream's text equals the same request's whole response; a stop string cuts the
greedy text exactly where the string first occurs).
"""
from __future__ import annotations

import base64
import gc
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from gguf import GGMLQuantizationType

from gateway.local.served_model import load_served_model
from tests.support.ggufgen import TINY_SPECIAL, write_tiny_llama
from tests.support.refs import REFS_DIR
from tests.support.servers import Server, rss_bytes, write_config

pytestmark = pytest.mark.real_model

REFS = json.loads((REFS_DIR / "greedy.json").read_text())
SMOL_EOG = {"0": -100, "2": -100, "4": -100}    # SmolLM2's end-of-generation ids, banned
TINY_A_CTX = 96


def counting_loader(counter: Counter[str]) -> Any:
    """The real loader, with every generated token counted per model (to see generation stop)."""
    def load(entry: Any) -> Any:
        served = load_served_model(entry)
        runner = served.scheduler.runner
        inner = runner.step

        def step() -> Any:
            result = inner()
            counter[entry.name] += len(result.sampled)
            return result

        runner.step = step
        return served
    return load


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("models")
    a = write_tiny_llama(d / "tiny_a.gguf", qtype=GGMLQuantizationType.Q8_0, seed=1)
    b = write_tiny_llama(d / "tiny_b.gguf", qtype=GGMLQuantizationType.Q4_0, seed=2)
    return a, b


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# ------------------------------------------------------------------ the main server

class TestServer:
    """One server, max_loaded_models 1; tests run in order (the first sees a fresh server)."""

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, tiny_models, smollm2_path, tmp_path_factory):
        a, b = tiny_models
        config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
            "registry": {"max_loaded_models": 1, "load_timeout": "60s"},
            "default_model": "tiny-b",
            "models": [
                {"model": str(a), "aliases": ["tiny-a", "tiny"], "n_ctx": TINY_A_CTX},
                {"model": str(b), "aliases": ["tiny-b", "tiny-b-too"], "n_ctx": 256},
                {"model": str(smollm2_path), "aliases": ["smollm2", "smol"], "n_ctx": 1024},
            ],
        })
        counter: Counter[str] = Counter()
        srv = Server(config, loader=counting_loader(counter)).start()
        srv.tokens = counter  # type: ignore[attr-defined]
        yield srv
        srv.stop()

    def test_nothing_is_loaded_at_start_up(self, server):
        snap = server.snapshot()
        assert {alias: row["state"] for alias, row in snap.items()} == {
            "tiny-a": "unloaded", "tiny-b": "unloaded", "smollm2": "unloaded"}

    def test_models_lists_every_alias_loaded_or_not(self, server):
        models = server.client.models.list().data
        assert [m.id for m in models] == ["tiny-a", "tiny", "tiny-b", "tiny-b-too", "smollm2", "smol"]
        assert {m.owned_by for m in models} == {"modelyard"} and {m.object for m in models} == {"model"}
        bare = httpx.get(server.url + "/models").json()
        assert [m["id"] for m in bare["data"]] == [m.id for m in models]
        assert server.snapshot()["smollm2"]["state"] == "unloaded"  # listing loads nothing

    def test_lazy_load_on_first_request(self, server):
        r = server.client.chat.completions.create(model="tiny-a", messages=user("hi"),
                                                  max_tokens=3, temperature=0)
        assert r.model == "tiny-a"
        snap = server.snapshot()
        assert snap["tiny-a"]["state"] == "ready"
        assert snap["tiny-b"]["state"] == snap["smollm2"]["state"] == "unloaded"

    def test_chat_by_every_alias(self, server):
        replies = {}
        for alias in ["tiny-a", "tiny", "tiny-b", "tiny-b-too", "smollm2", "smol"]:
            r = server.client.chat.completions.create(
                model=alias, messages=user("Hello there! What is the capital of France?"),
                max_tokens=6, temperature=1.0, seed=7,
                logit_bias=TINY_SPECIAL if "tiny" in alias else SMOL_EOG)
            assert r.model == alias and r.object == "chat.completion"
            choice = r.choices[0]
            assert choice.message.role == "assistant" and choice.finish_reason == "length"
            assert r.usage.completion_tokens == 6
            assert r.usage.total_tokens == r.usage.prompt_tokens + 6
            replies[alias] = choice.message.content
        # seeded sampling: aliases of one entry answer alike, different models differently
        assert replies["tiny-a"] == replies["tiny"]
        assert replies["tiny-b"] == replies["tiny-b-too"]
        assert replies["smollm2"] == replies["smol"]
        assert len({replies["tiny-a"], replies["tiny-b"], replies["smollm2"]}) == 3

    def test_lru_eviction_with_one_loaded_model(self, server):
        server.client.chat.completions.create(model="tiny-a", messages=user("a"), max_tokens=2)
        assert server.snapshot()["tiny-a"]["state"] == "ready"
        server.client.chat.completions.create(model="tiny-b", messages=user("b"), max_tokens=2)
        snap = server.wait_until(lambda s: s["tiny-a"]["state"] == "unloaded")
        assert snap["tiny-b"]["state"] == "ready" and snap["smollm2"]["state"] == "unloaded"

    def test_default_model_when_the_request_names_none(self, server):
        r = httpx.post(server.url + "/v1/chat/completions",
                       json={"messages": user("hi"), "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "tiny-b"

    @pytest.mark.slow
    def test_smollm2_reply_starts_like_llama_cpp(self, server):
        ref = REFS["chat"]
        r = server.client.chat.completions.create(model="smollm2", messages=ref["messages"],
                                                  temperature=0, max_tokens=10)
        assert r.usage.prompt_tokens == ref["usage"]["prompt_tokens"] == len(ref["prompt_ids"])
        # llama.cpp's first 7 tokens, "L'Étoile, la"; the first wins by only 0.35 logits.
        expected = server_tokenizer_text(ref["raw_ids"][:7])
        assert expected == "L'Étoile, la"
        assert r.choices[0].message.content.startswith(expected)

    def test_stream_matches_the_whole_response(self, server):
        kwargs = dict(model="smollm2", messages=user("Write a short poem about the sea."),
                      temperature=0, max_tokens=24)
        whole = server.client.chat.completions.create(**kwargs)
        chunks = list(server.client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert text == whole.choices[0].message.content
        assert finishes == [whole.choices[0].finish_reason]
        assert chunks[-1].choices == []
        for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert getattr(chunks[-1].usage, field) == getattr(whole.usage, field)
        # the second run found the prompt in a slot: all of it but the token that gives logits
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1
        assert all(c.usage is None for c in chunks[:-1])
        assert len({c.id for c in chunks}) == 1

    def test_stream_is_server_sent_events_ending_in_done(self, server):
        body = {"model": "tiny-a", "messages": user("hi"), "max_tokens": 4, "stream": True}
        with httpx.stream("POST", server.url + "/chat/completions", json=body, timeout=60) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = r.read().decode()
        events = [e for e in raw.split("\n\n") if e]
        assert all(e.startswith("data: ") for e in events)
        assert events[-1] == "data: [DONE]"
        for e in events[:-1]:
            assert json.loads(e[len("data: "):])["object"] == "chat.completion.chunk"

    def test_n_choices_and_seeds(self, server):
        kwargs = dict(model="tiny-b", messages=user("tell me something"), max_tokens=8,
                      logit_bias=TINY_SPECIAL)
        sampled = server.client.chat.completions.create(**kwargs, n=2, temperature=1.0, seed=42)
        assert [c.index for c in sampled.choices] == [0, 1]
        again = server.client.chat.completions.create(**kwargs, n=2, temperature=1.0, seed=42)
        texts = [c.message.content for c in sampled.choices]
        assert [c.message.content for c in again.choices] == texts  # seeded: reproducible
        assert texts[0] != texts[1]                                   # but each choice its own
        assert sampled.usage.completion_tokens == 16
        greedy = server.client.chat.completions.create(**kwargs, n=2, temperature=0)
        assert greedy.choices[0].message.content == greedy.choices[1].message.content
        streamed = list(server.client.chat.completions.create(**kwargs, n=2, temperature=1.0,
                                                              seed=42, stream=True))
        for i in range(2):
            parts = [c.choices[0].delta.content or "" for c in streamed
                     if c.choices and c.choices[0].index == i]
            assert "".join(parts) == texts[i]

    def test_stop_sequences_are_never_emitted(self, server):
        prompt = "The capital of France is"
        free = server.client.completions.create(model="smollm2", prompt=prompt, max_tokens=20,
                                                temperature=0, logprobs=0)
        text, tokens = free.choices[0].text, free.choices[0].logprobs.tokens
        assert "".join(tokens) == text
        # a stop string that spans a token boundary, taken from the middle of the greedy text
        at = len("".join(tokens[:4]))
        stop = text[at - 2:at + 2]
        expected = text[:text.find(stop)]
        cut = server.client.completions.create(model="smollm2", prompt=prompt, max_tokens=20,
                                               temperature=0, stop=[stop, "never-seen"])
        assert cut.choices[0].text == expected and cut.choices[0].finish_reason == "stop"
        chunks = list(server.client.completions.create(model="smollm2", prompt=prompt, max_tokens=20,
                                                       temperature=0, stop=stop, stream=True))
        pieces = [c.choices[0].text for c in chunks if c.choices]
        assert "".join(pieces) == expected
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        chat = server.client.chat.completions.create(model="smollm2", messages=user("Count: 1, 2, 3,"),
                                                     temperature=0, max_tokens=16)
        content = chat.choices[0].message.content
        stop = content[3:6]
        streamed = list(server.client.chat.completions.create(
            model="smollm2", messages=user("Count: 1, 2, 3,"), temperature=0, max_tokens=16,
            stop=[stop], stream=True))
        deltas = [c.choices[0].delta.content or "" for c in streamed if c.choices]
        assert "".join(deltas) == content[:content.find(stop)]
        assert not any(stop in d for d in deltas)

    def test_chat_logprobs(self, server):
        r = server.client.chat.completions.create(model="smollm2", messages=user("Say hello."),
                                                  temperature=0, max_tokens=6, logprobs=True,
                                                  top_logprobs=3, logit_bias=SMOL_EOG)
        content = r.choices[0].logprobs.content
        assert len(content) == 6
        assert b"".join(bytes(t.bytes) for t in content).decode() == r.choices[0].message.content
        for t in content:
            tops = [x.logprob for x in t.top_logprobs]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
            assert t.top_logprobs[0].token == t.token
            assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)

    def test_completions_several_prompts_and_echo(self, server):
        r = server.client.completions.create(model="tiny-b", prompt=["the quick", "hello world"],
                                             max_tokens=3, temperature=0, n=2, echo=True,
                                             logit_bias=TINY_SPECIAL)
        assert [c.index for c in r.choices] == [0, 1, 2, 3]
        assert r.choices[0].text.startswith("the quick") and r.choices[2].text.startswith("hello world")
        assert r.choices[0].text == r.choices[1].text  # greedy: both choices agree
        assert r.usage.completion_tokens == 12
        ids = server.client.completions.create(model="tiny-b", prompt=[5, 6, 7], max_tokens=2)
        assert ids.usage.prompt_tokens == 3

    def test_embeddings(self, server):
        r = server.client.embeddings.create(model="tiny-a", input=["hello world", "hello world", "other"])
        vectors = np.array([d.embedding for d in r.data])  # [3, n_embd]
        assert vectors.shape == (3, 64) and [d.index for d in r.data] == [0, 1, 2]
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert np.array_equal(vectors[0], vectors[1]) and not np.allclose(vectors[0], vectors[2])
        raw = httpx.post(server.url + "/v1/embeddings", timeout=60, json={
            "model": "tiny-a", "input": "hello world", "encoding_format": "base64"}).json()
        decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
        assert np.allclose(decoded, vectors[0])

    def test_unknown_model_is_404_naming_the_aliases(self, server):
        with pytest.raises(openai.NotFoundError) as info:
            server.client.chat.completions.create(model="gpt-4", messages=user("hi"))
        err = info.value.body
        assert err["code"] == "model_not_found" and err["param"] == "model"
        for alias in ["tiny-a", "tiny", "tiny-b", "tiny-b-too", "smollm2", "smol"]:
            assert alias in err["message"]
        r = httpx.post(server.url + "/v1/embeddings", json={"model": "nope", "input": "x"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"

    def test_malformed_json_and_wrong_types_are_400(self, server):
        r = httpx.post(server.url + "/v1/chat/completions", content=b'{"model": "tiny-a", "messages": [',
                       headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert set(r.json()["error"]) >= {"message", "type", "param", "code"}
        assert r.json()["error"]["type"] == "invalid_request_error"
        for body, param in [({"model": "tiny-a", "messages": user("x"), "temperature": "hot"}, "temperature"),
                            ({"model": "tiny-a", "messages": [{"role": "user", "content": 5}]},
                             "messages[0].content"),
                            ({"model": "tiny-a", "prompt": "x", "max_tokens": -1}, "max_tokens")]:
            path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
            r = httpx.post(server.url + path, json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param
        with pytest.raises(openai.BadRequestError) as info:
            server.client.chat.completions.create(model="tiny-a", messages=user("x"), n=0)
        assert info.value.body["param"] == "n"
        r = httpx.post(server.url + "/v1/chat/completions", json={
            "model": "tiny-a", "messages": user("x"), "logit_bias": {"999999": 1}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
        r = httpx.get(server.url + "/v1/nothing-here")
        assert r.status_code == 404 and "error" in r.json()

    def test_over_long_prompt_is_400_context_length_exceeded(self, server):
        with pytest.raises(openai.BadRequestError) as info:
            server.client.chat.completions.create(model="tiny-a", messages=user("hello world " * 100))
        err = info.value.body
        assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
        assert err["n_ctx"] == TINY_A_CTX and err["n_prompt_tokens"] > TINY_A_CTX
        with pytest.raises(openai.BadRequestError) as info:
            server.client.completions.create(model="tiny-a", prompt="hello world " * 100)
        assert info.value.body["code"] == "context_length_exceeded"

    def test_prompt_that_fits_with_little_room_stops_at_length(self, server):
        r = server.client.chat.completions.create(model="tiny-a", messages=user("hello world " * 6),
                                                  max_tokens=80, temperature=0, logit_bias=TINY_SPECIAL)
        room = TINY_A_CTX - r.usage.prompt_tokens
        assert 0 < room < 80
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == room

    def test_client_disconnect_frees_the_model_and_stops_generation(self, server):
        body = {"model": "smollm2", "messages": user("Tell me a very long story."), "stream": True,
                "max_tokens": 900, "logit_bias": SMOL_EOG}
        before = server.tokens["smollm2"]
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen == 3:
                    assert server.snapshot()["smollm2"]["in_flight"] == 1
                    break
        server.wait_until(lambda s: s["smollm2"]["in_flight"] == 0)
        time.sleep(0.5)
        stopped_at = server.tokens["smollm2"]
        time.sleep(0.5)
        assert server.tokens["smollm2"] == stopped_at < before + 900
        ok = server.client.chat.completions.create(model="smollm2", messages=user("hi"), max_tokens=2)
        assert ok.choices[0].message.content is not None

    def test_client_leaving_a_whole_response_also_stops_generation(self, server):
        body = {"model": "smollm2", "messages": user("Tell me a very long story."),
                "max_tokens": 900, "logit_bias": SMOL_EOG}
        before = server.tokens["smollm2"]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/chat/completions", json=body, timeout=1.0)
        server.wait_until(lambda s: s["smollm2"]["in_flight"] == 0)
        time.sleep(0.5)
        stopped_at = server.tokens["smollm2"]
        time.sleep(0.5)
        assert server.tokens["smollm2"] == stopped_at < before + 900

    @pytest.mark.slow
    def test_no_eviction_mid_stream(self, server):
        body = dict(model="smollm2", messages=user("Tell me a very long story."), max_tokens=300,
                    logit_bias=SMOL_EOG, temperature=0)
        stream = server.client.chat.completions.create(**body, stream=True)
        chunks = [next(stream), next(stream)]
        other: dict[str, Any] = {}

        def ask_tiny() -> None:
            other["reply"] = server.client.chat.completions.create(model="tiny-b", messages=user("x"),
                                                                   max_tokens=2)
        asker = threading.Thread(target=ask_tiny)
        asker.start()
        time.sleep(0.3)
        snap = server.snapshot()
        assert snap["smollm2"]["state"] == "ready" and snap["smollm2"]["in_flight"] == 1
        assert snap["tiny-b"]["state"] == "unloaded" and asker.is_alive()
        chunks += list(stream)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == ["length"]
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 250
        asker.join(60)
        assert other["reply"].model == "tiny-b"
        snap = server.wait_until(lambda s: s["smollm2"]["state"] == "unloaded")
        assert snap["tiny-b"]["state"] == "ready"


def server_tokenizer_text(ids: list[int]) -> str:
    """Text of SmolLM2 token ids, read from the vocabulary with gguf-py (not our tokenizer)."""
    from gguf import GGUFReader

    from engine.default_model import default_model_path
    from tests.support.ggufgen import byte_to_unicode

    field = GGUFReader(default_model_path()).fields["tokenizer.ggml.tokens"]
    u2b = {u: b for b, u in byte_to_unicode().items()}
    pieces = [bytes(field.parts[field.data[i]]).decode() for i in ids]
    return bytes(u2b[ch] for piece in pieces for ch in piece).decode()


# ------------------------------------------------------------------ idle unload, pinning, RSS

class TestIdleServer:
    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, tiny_models, smollm2_path, tmp_path_factory):
        _, b = tiny_models
        config = write_config(tmp_path_factory.mktemp("cfg") / "idle.yaml", {
            "registry": {"idle_timeout": "1s", "max_loaded_models": 2},
            "models": [
                {"model": str(b), "aliases": ["tiny-b"], "n_ctx": 128, "pinned": True},
                {"model": str(smollm2_path), "aliases": ["smollm2"], "n_ctx": 2048},
            ],
        })
        srv = Server(config).start()
        yield srv
        srv.stop()

    def test_pinned_model_loads_at_start_up_and_others_wait(self, server):
        snap = server.wait_until(lambda s: s["tiny-b"]["state"] == "ready")
        assert snap["smollm2"]["state"] == "unloaded"

    def test_idle_unload_gives_the_memory_back(self, server):
        gc.collect()
        before = rss_bytes()
        r = server.client.chat.completions.create(model="smollm2", messages=user("Hello!"),
                                                  max_tokens=8, temperature=0)
        assert r.choices[0].message.content
        loaded = rss_bytes()
        assert server.snapshot()["smollm2"]["state"] == "ready"
        grown = loaded - before
        assert grown > 60 * 2**20, f"loading SmolLM2 grew RSS by only {grown / 2**20:.0f} MiB"
        snap = server.wait_until(lambda s: s["smollm2"]["state"] == "unloaded", timeout=15)
        assert snap["tiny-b"]["state"] == "ready"  # pinned: never idle-unloaded
        gc.collect()
        after = rss_bytes()
        assert after - before < 0.25 * grown, (
            f"RSS before {before / 2**20:.0f} MiB, loaded {loaded / 2**20:.0f}, after {after / 2**20:.0f}")
