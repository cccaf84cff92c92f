"""gpt-oss against llama.cpp on the tiny models of tests/data/synth3 (README there: how they
were made, how close is close): F32 and MXFP4 experts, batched, one token at a time, split in
two calls, greedy; the fused graph against the eager twin; switching a feature off moves the
logits by what llama.cpp's copy measured; the routing and activation kernels against their twins.

llama.cpp ran flash attention off, so the engine does too (as tests/test_qwen3moe.py).
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import engine
from engine.kernels import moe_oai
from engine.model import Chunk
from engine.servable import check_servable
from tests.support.llama_cpp_checks import assert_greedy_until_a_near_tie, assert_synth_logits
from tests.support.refs import SYNTH3_DIR

MANIFEST = json.loads((SYNTH3_DIR / "manifest.json").read_text())
ENTRIES = {e["file"][:-len(".gguf")]: e for e in MANIFEST["models"] if e["arch"] == "gpt-oss"}
F32 = "gptoss_d64_e8k2_swa8_sinks_f32"


def _load(name: str, **kw) -> engine.Model:
    return engine.load(SYNTH3_DIR / f"{name}.gguf", n_ctx=kw.pop("n_ctx", 128), n_threads=2,
                       flash_attn=kw.pop("flash_attn", False), **kw)


def test_the_files_are_the_ones_the_manifest_describes() -> None:
    assert set(ENTRIES) == {F32, "gptoss_d64_e8k2_swa8_sinks_mxfp4"}
    for name, entry in ENTRIES.items():
        hp = check_servable(SYNTH3_DIR / f"{name}.gguf")
        want = entry["hparams"]
        assert (hp.extra["n_expert"], hp.extra["n_expert_used"], hp.extra["n_ff_exp"]) == (
            want["n_expert"], want["n_expert_used"], want["n_ff_exp"])
        assert [li for li in range(hp.n_layer) if hp.layer_window(li)] == want["swa_layers"]
        assert hp.window == want["sliding_window"] and hp.spec.attn_sinks


@pytest.mark.parametrize("name", list(ENTRIES))
def test_logits_match_llama_cpp_batched_sequential_and_split(name: str) -> None:
    ref = np.load(SYNTH3_DIR / f"{name}.npz")
    with _load(name, n_slots=3) as model:
        assert_synth_logits(model.transformer, ref, ENTRIES[name]["suggested_tolerance"], name)

@pytest.mark.parametrize("name", list(ENTRIES))
def test_greedy_tokens_match_llama_cpp_until_a_near_tie(name: str) -> None:
    ref = np.load(SYNTH3_DIR / f"{name}.npz")
    ids, want = ref["ids"].tolist(), ref["greedy"].tolist()
    with _load(name) as model:
        assert_greedy_until_a_near_tie(model, ids, want)


@pytest.mark.parametrize("flash_attn", [True, False])
@pytest.mark.parametrize("name", list(ENTRIES))
def test_fused_pass_equals_eager_pass(name: str, flash_attn: bool) -> None:
    """The task graph and the eager twin give the same bits: a prompt past the window, its
    continuation, and a batched decode of three sequences (both attention paths with sinks)."""
    ids = np.load(SYNTH3_DIR / f"{name}.npz")["ids"].tolist()
    with _load(name, n_slots=6, flash_attn=flash_attn) as model:
        tr = model.transformer
        for chunks in ([Chunk(0, ids[:30], 0)], [Chunk(0, ids[30:], 30)],
                       [Chunk(0, [5], 40), Chunk(1, ids[:7], 0), Chunk(2, [ids[3]], 0)]):
            fused = tr.forward(chunks, "all")
            eager = tr.forward_eager([Chunk(c.slot + 3, c.tokens, c.pos0) for c in chunks], "all")
            for f, e in zip(fused, eager):
                np.testing.assert_array_equal(f, e)


def test_sinks_switched_off_move_the_logits_as_llama_cpp_saw() -> None:
    """With every sink at -1e4 (a logit that takes no share), our logits leave llama.cpp's by
    about the mean the manifest's feature_effects measured for the same copy in llama.cpp
    (2.5): the logits tests above would see sinks ignored, and they are read per head."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")
    effect = ENTRIES[F32]["feature_effects"]["no_sinks (attn_sinks -1e4)"]
    with _load(F32) as model:
        tr = model.transformer
        for layer in tr.weights.layers:
            layer.sinks[:] = -1e4  # in place: the graph points at these arrays
        ours = tr.forward([Chunk(0, ref["ids"].tolist(), 0)], "all")[0]
    moved = float(np.abs(ours - ref["logits"]).mean())
    assert moved == pytest.approx(effect["mean_abs_diff"], rel=0.1)


def test_the_window_moves_the_logits_from_its_first_row_past_it() -> None:
    """Without the window (a window of 4096), the first 8 rows (= window) stay and the later
    ones move by about llama.cpp's measured mean: the alternate layers do slide."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")
    effect = ENTRIES[F32]["feature_effects"]["no_swa (sliding_window 4096)"]
    with _load(F32) as model:
        tr = model.transformer
        tr.hp = dataclasses.replace(tr.hp, window=0)  # every layer sees all keys
        tr._graphs.clear()
        ours = tr.forward([Chunk(0, ref["ids"].tolist(), 0)], "all")[0]
    diff = np.abs(ours - ref["logits"])
    assert diff[:effect["first_row_changed"]].max() < 2e-2
    assert float(diff.mean()) == pytest.approx(effect["mean_abs_diff"], rel=0.1)


def test_top_k_softmax_routing_matches_its_twin() -> None:
    rng = np.random.default_rng(28)
    logits = rng.normal(0, 2, size=(37, 8)).astype(np.float32)
    for k in (1, 2, 4):
        ids, w = moe_oai.route_topk(logits, k)
        want_ids, want_w = moe_oai.route_topk_reference(logits, k)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(w, want_w, rtol=1e-6, atol=1e-7)
    assert np.all(moe_oai.route_topk(logits, 1)[1] == 1.0)  # one expert: the whole weight
    with pytest.raises(ValueError, match="cannot choose"):
        moe_oai.route_topk(logits, 9)


def test_swiglu_oai_matches_its_twin_and_clamps() -> None:
    rng = np.random.default_rng(29)
    gate = rng.normal(0, 6, size=(5, 67)).astype(np.float32)  # ~25% beyond the clamp at 7
    up = rng.normal(0, 6, size=(5, 67)).astype(np.float32)
    got = moe_oai.swiglu_oai(gate, up)
    np.testing.assert_allclose(got, moe_oai.swiglu_oai_reference(gate, up), rtol=2e-6, atol=1e-6)
    big = moe_oai.swiglu_oai(np.full(8, 50.0, np.float32), np.full(8, -50.0, np.float32))
    np.testing.assert_allclose(big, 7.0 / (1 + np.exp(-1.702 * 7.0)) * -6.0, rtol=1e-6)
