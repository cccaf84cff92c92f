"""An entry's LoRA adapters (`lora: [{path, scale}]`, llama-cpp-python's `lora_path`): checked
against the model at config load, each bad one a `file:line` error; a good entry's adapters reach
the engine and change its logits as llama.cpp's do (tests/data/lora)."""
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from engine.model import Chunk
from gateway.config import ConfigError, load_config
from gateway.local.served_model import load_served_model
from tests.support.llama_cpp_checks import assert_within
from tests.support.refs import SYNTH_DIR

LORA_DIR = SYNTH_DIR.parent / "lora"
BASE, OTHER = "qwen2_d64_gqa2_bias_f32.gguf", "qwen3_d64_hd32_qknorm_f32.gguf"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for src in (SYNTH_DIR / BASE, SYNTH_DIR / OTHER, LORA_DIR / "adapter_a.gguf",
                LORA_DIR / "adapter_b.gguf"):
        shutil.copy(src, tmp_path / src.name)
    return tmp_path


def write(folder: Path, text: str) -> Path:
    path = folder / "c.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def errors(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.errors


def test_lora_path_is_one_adapter_at_scale_one(folder: Path) -> None:
    entry = load_config(write(folder, f"""
        models:
          - model: {BASE}
            lora_path: adapter_a.gguf
    """)).models[0]
    assert [(a.path, a.scale) for a in entry.lora] == [(folder / "adapter_a.gguf", 1.0)]


def test_lora_lists_adapters_with_scales_and_they_reach_the_engine(folder: Path) -> None:
    entry = load_config(write(folder, f"""
        models:
          - model: {BASE}
            n_ctx: 64
            flash_attn: false
            lora:
              - {{path: adapter_a.gguf, scale: 0.7}}
              - {{path: adapter_b.gguf, scale: 0.5}}
    """)).models[0]
    assert [(a.path.name, a.scale) for a in entry.lora] == [("adapter_a.gguf", 0.7),
                                                             ("adapter_b.gguf", 0.5)]
    ref = np.load(LORA_DIR / "qwen2_d64_gqa2_bias_f32.npz")
    assert ref["pair_scales"].tolist() == pytest.approx([0.7, 0.5])
    served = load_served_model(entry)
    try:
        tr = served.model.transformer
        logits = tr.forward([Chunk(0, ref["ids"].tolist(), 0)], "all")[0]
    finally:
        served.close()
    assert_within(logits, ref["logits_pair"], {"max_abs": 0.02, "mean_abs": 0.002,
                                               "top1_agree_min": 38}, "config pair")


@pytest.mark.parametrize("adapter, model, problem", [
    ("missing.gguf", BASE, "LoRA adapter file not found"),
    (BASE, BASE, "not a LoRA adapter"),
    ("adapter_a.gguf", OTHER, "a LoRA adapter for 'qwen2', the model is 'qwen3'"),
])
def test_bad_adapters_are_file_line_errors(folder: Path, adapter: str, model: str,
                                           problem: str) -> None:
    for key in ("lora_path", "lora"):
        value = adapter if key == "lora_path" else f"[{{path: {adapter}}}]"
        errs = errors(write(folder, f"""
            models:
              - model: {model}
                {key}: {value}
        """))
        assert len(errs) == 1 and problem in errs[0], errs
        assert "c.yaml:3" in errs[0], errs


def test_a_bad_scale_and_both_keys_are_errors(folder: Path) -> None:
    errs = errors(write(folder, f"""
        models:
          - model: {BASE}
            lora: [{{path: adapter_a.gguf, scale: .nan}}]
    """))
    assert any("finite number" in e for e in errs), errs
    errs = errors(write(folder, f"""
        models:
          - model: {BASE}
            lora_path: adapter_a.gguf
            lora: [{{path: adapter_b.gguf}}]
    """))
    assert any("not both" in e for e in errs), errs


def test_lora_adapters_lists_the_entrys_adapters_and_sets_global_scales(
        folder: Path, apps) -> None:
    """llama-server's /lora-adapters: GET lists, POST sets the global scales (unlisted: 0) that
    requests without `lora` decode at; a request's own `lora` wins for itself; a bad id is a
    400 naming `lora`."""
    client = apps.client(write(folder, f"""
        models:
          - model: {BASE}
            aliases: [tiny]
            n_ctx: 64
            n_parallel: 2
            lora:
              - {{path: adapter_a.gguf, scale: 0.7}}
              - {{path: adapter_b.gguf}}
          - model: {BASE}
            aliases: [bare]
            n_ctx: 64
          - model: {OTHER}
            aliases: [plain]
            n_ctx: 64
    """))
    got = client.get("/lora-adapters?model=tiny")
    assert got.status_code == 200
    assert got.json() == [{"id": 0, "path": "adapter_a.gguf", "scale": 0.7},
                          {"id": 1, "path": "adapter_b.gguf", "scale": 1.0}]
    assert client.get("/lora-adapters?model=plain").json() == []

    def text(model: str, **extra: object) -> str:
        r = client.post("/completion", json={"model": model, "prompt": "hello world",
                                             "n_predict": 8, "temperature": 0, **extra})
        assert r.status_code == 200, r.text
        return str(r.json()["content"])

    merged = text("tiny")
    bare = text("bare")  # the same base with no adapter: what scale 0 must give
    assert merged != bare
    assert text("tiny", lora=[]) == bare  # listed none: every adapter at 0, as llama-server
    assert text("tiny", lora=[{"id": 0, "scale": 0.7}, {"id": 1, "scale": 1}]) == merged
    chat = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
        "temperature": 0, "lora": [{"id": 1, "scale": 0.0}]})
    assert chat.status_code == 200, chat.text
    bad = client.post("/completion", json={"model": "tiny", "prompt": "x", "n_predict": 2,
                                           "lora": [{"id": 2, "scale": 1.0}]})
    assert bad.status_code == 400 and "lora" in bad.text

    assert client.post("/lora-adapters?model=tiny", json=[{"id": 5, "scale": 0.2}]).status_code == 400
    assert client.post("/lora-adapters?model=tiny", json={"id": 0}).status_code == 400
    ok = client.post("/lora-adapters?model=tiny", json=[])
    assert ok.status_code == 200
    assert [a["scale"] for a in client.get("/lora-adapters?model=tiny").json()] == [0.0, 0.0]
    assert text("tiny") == bare  # the global scales, now 0
    assert text("tiny", lora=[{"id": 0, "scale": 0.7}, {"id": 1, "scale": 1.0}]) == merged


def test_n_ctx_0s_memory_bound_counts_the_merged_adapters(folder: Path) -> None:
    import engine
    from engine.servable import trained_context

    model = folder / BASE
    n_ctx = trained_context(model)
    plain = engine.estimate_memory(model, n_ctx, 1)
    adapted = engine.estimate_memory(model, n_ctx, 1, lora=[engine.LoraSpec(
        folder / "adapter_a.gguf")])
    assert adapted > plain
    budget = (plain + adapted) // 2  # enough without the adapter, not with it
    text = f"""
        registry: {{memory_budget: {budget}}}
        models:
          - model: {BASE}
            n_ctx: 0
            n_parallel: 1
    """
    assert load_config(write(folder, text)).models[0].n_ctx == n_ctx
    errs = errors(write(folder, text.rstrip(" ") + "            lora_path: adapter_a.gguf\n"))
    assert len(errs) == 1 and "over memory_budget" in errs[0], errs
