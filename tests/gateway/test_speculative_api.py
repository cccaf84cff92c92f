"""Speculative decoding served: an entry's `draft:` key (and llama-cpp-python's `draft_model`),
the per-request opt-outs, llama.cpp's `timings.draft_n` / `draft_n_accepted` and the /metrics
counters. The expectation is the same model served without drafting: greedy replies must be
identical; the engine-level exactness tests are tests/engine/test_speculative.py."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.config import ConfigError, load_config
from tests.support.apps import Apps
from tests.support.ggufgen import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("spec") / "tiny.gguf")


@pytest.fixture(scope="module")
def client(tiny: Path, module_apps: Apps) -> Any:
    common = {"model": str(tiny), "n_ctx": 256, "n_parallel": 2}
    return module_apps.client({"models": [
        {**common, "aliases": ["plain"]},
        {**common, "aliases": ["lookup"], "draft": {"lookup": "ngram", "n_draft": 6}},
        {**common, "aliases": ["llama-cpp"], "draft_model": "prompt-lookup-decoding",
         "draft_model_num_pred_tokens": 4}]})


def _prompt(seed: int) -> list[int]:
    phrase = np.random.default_rng(seed).integers(3, 300, 10).tolist()
    return phrase * 4


def _complete(client: Any, model: str, prompt: list[int], **extra: Any) -> dict[str, Any]:
    r = client.post("/completion", json={"model": model, "prompt": prompt, "n_predict": 40,
                                         "temperature": 0, "return_tokens": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("model", ["lookup", "llama-cpp"])
def test_greedy_replies_equal_the_undrafted_models(client: Any, model: str) -> None:
    drafted = 0
    for seed in range(3):
        plain = _complete(client, "plain", _prompt(seed))
        spec = _complete(client, model, _prompt(seed))
        assert spec["tokens"] == plain["tokens"] and spec["content"] == plain["content"]
        assert "draft_n" not in plain["timings"]
        timings = spec["timings"]
        drafted += timings.get("draft_n", 0)
        assert 0 <= timings.get("draft_n_accepted", 0) <= timings.get("draft_n", 0)
    assert drafted > 0


def test_a_stop_string_inside_a_drafted_run_ends_it_as_without(client: Any) -> None:
    prompt = _prompt(2)
    text = _complete(client, "plain", prompt)["content"]
    for at in range(4, len(text) - 2, max(1, len(text) // 8)):  # stops all along the reply
        stop = text[at:at + 2]
        plain = _complete(client, "plain", prompt, stop=[stop])
        spec = _complete(client, "lookup", prompt, stop=[stop])
        assert spec["stopping_word"] == plain["stopping_word"] == stop
        assert spec["content"] == plain["content"]
        assert spec["tokens_predicted"] == plain["tokens_predicted"], stop


@pytest.mark.parametrize("opt_out", [{"speculative": False}, {"speculative.n_max": 0}])
def test_a_request_opts_out(client: Any, opt_out: dict[str, Any]) -> None:
    spec = _complete(client, "lookup", _prompt(5), **opt_out)
    assert "draft_n" not in spec["timings"]
    assert spec["tokens"] == _complete(client, "plain", _prompt(5))["tokens"]


def test_openai_completions_opt_out_and_agree(client: Any) -> None:
    body = {"prompt": _prompt(6), "max_tokens": 30, "temperature": 0}
    texts = [client.post("/v1/completions", json={"model": m, **body, **extra}).json()
             ["choices"][0]["text"]
             for m, extra in [("plain", {}), ("lookup", {}), ("lookup", {"speculative": False})]]
    assert texts[0] == texts[1] == texts[2]


def test_metrics_count_drafted_and_accepted_tokens(client: Any) -> None:
    def counter(text: str, name: str) -> float:
        line = next((ln for ln in text.splitlines()
                     if ln.startswith(f'{name}_total{{model="lookup"}}')), None)
        return float(line.split()[-1]) if line else 0.0

    before = client.get("/metrics").text
    timings = _complete(client, "lookup", _prompt(7))["timings"]
    after = client.get("/metrics").text
    assert (counter(after, "modelyard_draft_tokens") - counter(before, "modelyard_draft_tokens")
            == timings["draft_n"])
    assert (counter(after, "modelyard_draft_accepted_tokens")
            - counter(before, "modelyard_draft_accepted_tokens") == timings["draft_n_accepted"])


# -- config ----------------------------------------------------------------------------------

def _write(folder: Path, tiny: Path, text: str) -> Path:
    path = folder / "c.yaml"
    path.write_text(textwrap.dedent(text.format(model=tiny)).lstrip("\n"))
    return path


def test_llama_cpp_pythons_draft_model_is_prompt_lookup(tmp_path: Path, tiny: Path) -> None:
    config = load_config(_write(tmp_path, tiny, """
        models:
          - model: {model}
            draft_model: prompt-lookup-decoding
            draft_model_num_pred_tokens: 5
          - model: {model}
            aliases: [b]
            draft: {{lookup: ngram}}
    """))
    a, b = config.models
    assert (a.draft and (a.draft.n_draft, a.draft.ngram_min, a.draft.ngram_max)) == (5, 1, 2)
    assert (b.draft and (b.draft.n_draft, b.draft.ngram_min, b.draft.ngram_max)) == (8, 1, 3)
    assert config.warnings == []


def test_bad_draft_values_are_errors_at_their_line(tmp_path: Path, tiny: Path) -> None:
    path = _write(tmp_path, tiny, """
        models:
          - model: {model}
            draft: {{lookup: ngram, n_draft: 0}}
          - model: {model}
            aliases: [b]
            draft: {{lookup: ngram, ngram_min: 4, ngram_max: 2}}
          - model: {model}
            aliases: [c]
            draft: {{lookup: bigram}}
          - model: {model}
            aliases: [d]
            draft: {{lookup: ngram}}
            draft_model: prompt-lookup-decoding
    """)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    errors = info.value.errors
    assert any(e.startswith(f"{path}:3: models.0.draft.n_draft") for e in errors), errors
    assert any(e.startswith(f"{path}:6: models.1.draft") and "ngram_min (4) is above" in e
               for e in errors), errors
    assert any(e.startswith(f"{path}:9: models.2.draft.lookup") for e in errors), errors
    assert any(e.startswith(f"{path}:13: models.3.draft_model: give `draft` or `draft_model`")
               for e in errors), errors


# -- a draft model -----------------------------------------------------------------------------

def test_a_draft_model_drafts_and_changes_nothing_greedy(tiny: Path, apps: Apps) -> None:
    other = write_tiny_llama(tiny.parent / "other_weights.gguf", seed=3)  # same vocabulary
    common = {"model": str(tiny), "n_ctx": 256, "n_parallel": 2}
    client = apps.client({"models": [
        {**common, "aliases": ["plain"]},
        {**common, "aliases": ["self"], "draft": {"model": str(tiny), "n_draft": 4}},
        {**common, "aliases": ["other"], "draft": {"model": str(other), "p_min": 0.05}}]})
    plain = _complete(client, "plain", _prompt(1))
    same = _complete(client, "self", _prompt(1))
    differs = _complete(client, "other", _prompt(1))
    assert same["tokens"] == plain["tokens"] == differs["tokens"]
    # the model drafting for itself is always right
    assert same["timings"]["draft_n"] == same["timings"]["draft_n_accepted"] > 0
    # llama-server's test_with_and_without_draft: seeded sampling, the same tokens either way
    seeded = {"temperature": 0.2, "top_k": 5, "seed": 4242}
    plain = _complete(client, "plain", _prompt(2), **seeded)
    drafted = _complete(client, "self", _prompt(2), **seeded)
    assert drafted["tokens"] == plain["tokens"]
    assert drafted["timings"]["draft_n"] > 0


def test_a_draft_of_another_vocabulary_is_an_error_at_its_line(tmp_path: Path, tiny: Path) -> None:
    other = write_tiny_llama(tmp_path / "other_vocab.gguf", n_merges=20)
    path = _write(tmp_path, tiny, """
        models:
          - model: {model}
            draft:
              model: other_vocab.gguf
          - model: {model}
            aliases: [b]
            draft: {{model: missing.gguf}}
          - model: {model}
            aliases: [c]
            draft: {{model: other_vocab.gguf, lookup: ngram}}
    """)
    assert other.parent == path.parent
    with pytest.raises(ConfigError) as info:
        load_config(path)
    errors = info.value.errors
    assert any(e.startswith(f"{path}:4: models.0.draft.model: other_vocab.gguf cannot draft "
                            f"for {tiny.name}: its vocabulary has") for e in errors), errors
    assert any(e.startswith(f"{path}:7: models.1.draft.model: draft model file not found")
               for e in errors), errors
    assert any(e.startswith(f"{path}:10: models.2.draft") and "give one of" in e
               for e in errors), errors


def test_the_draft_models_memory_counts_in_the_estimate(tmp_path: Path, tiny: Path) -> None:
    import engine
    from gateway.fleet.registry.slots import engine_estimator

    config = load_config(_write(tmp_path, tiny, """
        models:
          - model: {model}
            n_ctx: 256
          - model: {model}
            aliases: [b]
            n_ctx: 256
            draft: {{model: {model}}}
    """))
    alone, drafted = (engine_estimator(e) for e in config.models)
    assert drafted - alone == engine.estimate_memory(tiny, 256, n_slots=4)
