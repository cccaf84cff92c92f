"""gemma4 against llama.cpp on the tiny models of tests/data/synth3 (README there: how they were
made, how close is close): F32 and Q8_0, batched, one token at a time, split in two calls (the
second from the cached state), greedy; the fused graph against the eager twin; switching a
feature off moves the logits by what llama.cpp's copy measured (so the logits tests would see
KV sharing, the window, the per-layer embeddings and the softcap ignored); the float64 twin
(tests/support/gemma4_reference.py, written from llama.cpp's graph) against llama.cpp's logits;
KV sharing's cache: the layers that read another's keep none, and the estimate counts none.

llama.cpp ran flash attention off, so the engine does too (as tests/engine/test_gptoss.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

import engine
from engine.api import estimate_memory
from engine.formats import quants
from engine.kv import KVCache, KVLayout
from engine.model import Chunk
from engine.servable import check_servable
from tests.support.gemma4_files import (
    N_FF,
    N_HEAD_KV,
    write_per_layer_variant,
    write_quantized_projection_variant,
)
from tests.support.gemma4_reference import Gemma4Reference
from tests.support.llama_cpp_checks import (
    assert_greedy_until_a_near_tie,
    assert_synth_logits,
    assert_within,
)
from tests.support.refs import SYNTH3_DIR

MANIFEST = json.loads((SYNTH3_DIR / "gemma4_manifest.json").read_text())
ENTRIES = {e["file"][:-len(".gguf")]: e for e in MANIFEST["models"]}
F32 = "gemma4_d64_l6_ple_kvshare_f32"


def _load(name: str, **kw) -> engine.Model:
    return engine.load(SYNTH3_DIR / f"{name}.gguf", n_ctx=kw.pop("n_ctx", 128), n_threads=2,
                       flash_attn=kw.pop("flash_attn", False), **kw)


def _batched(name: str, tweak=None) -> np.ndarray:
    """llama.cpp's prompt through the fused graph in one call, after tweak(transformer)."""
    ids = np.load(SYNTH3_DIR / f"{name}.npz")["ids"].tolist()
    with _load(name) as model:
        tr = model.transformer
        if tweak is not None:
            tweak(tr)
            tr._graphs.clear()
        return tr.forward([Chunk(0, ids, 0)], "all")[0]


def test_the_header_gives_the_manifests_hyperparameters() -> None:
    assert set(ENTRIES) == {F32, "gemma4_d64_l6_ple_kvshare_q8_0"}
    for name, entry in ENTRIES.items():
        hp = check_servable(SYNTH3_DIR / f"{name}.gguf")
        want = entry["hparams"]
        assert [li for li in range(hp.n_layer) if hp.layer_window(li)] == want["swa_layers"]
        assert hp.window == want["sliding_window"]
        assert [hp.layer_head_dim(li) for li in want["global_layers"]] == [want["head_dim_full"]] * 2
        assert [hp.layer_head_dim(li) for li in want["swa_layers"]] == [want["head_dim_swa"]] * 4
        assert [hp.layer_n_rot(li) for li in (3, 0)] == [want["n_rot_full"], want["n_rot_swa"]]
        assert {li: hp.kv_layer(li) for li in range(hp.n_layer) if not hp.has_kv(li)} == {
            int(k): v for k, v in want["kv_reuse"].items()}
        assert hp.extra["n_embd_per_layer"] == want["n_embd_per_layer"]
        assert hp.embed_scale == want["embedding_scale"] and hp.scale() == want["attention_scale"]
        assert hp.final_softcap == want["final_logit_softcapping"]
        assert hp.rope_base_swa == want["rope_freq_base_swa"]


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
    continuation, and a batched decode of three sequences (the shared layers among them)."""
    ids = np.load(SYNTH3_DIR / f"{name}.npz")["ids"].tolist()
    with _load(name, n_slots=6, flash_attn=flash_attn) as model:
        tr = model.transformer
        for chunks in ([Chunk(0, ids[:30], 0)], [Chunk(0, ids[30:], 30)],
                       [Chunk(0, [5], 40), Chunk(1, ids[:7], 0), Chunk(2, [ids[3]], 0)]):
            for output in ("all", "hidden"):
                fused = tr.forward(chunks, output)
                eager = tr.forward_eager([Chunk(c.slot + 3, c.tokens, c.pos0) for c in chunks],
                                         output)
                for f, e in zip(fused, eager):
                    np.testing.assert_array_equal(f, e)


def test_switching_features_off_moves_the_logits_as_llama_cpp_saw() -> None:
    """Each feature, off, moves our logits from llama.cpp's by about the mean its copy of the
    file measured: the window (first changed row = the window), the per-layer embeddings and
    the final softcap are all in the computation the logits tests check."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")["logits"]
    effects = ENTRIES[F32]["feature_effects"]

    def no_window(tr) -> None:
        tr.hp = dataclasses.replace(tr.hp, window=4096)

    def no_ple(tr) -> None:
        for name in ("ple_embd", "ple_model_proj"):  # zero bytes: 0.0 in F32
            m = tr.weights.extra[name]
            tr.weights.extra[name] = quants.QuantMatrix(np.zeros_like(m.raw), m.qtype, m.n_rows,
                                                        m.n_cols)

    def no_softcap(tr) -> None:
        tr.hp = dataclasses.replace(tr.hp, final_softcap=0.0)

    for tweak, key, rel in ((no_window, "no_swa (sliding_window 4096)", 0.1),
                            (no_ple, "ple_zero (per_layer_token_embd = 0, per_layer_model_proj = 0)", 0.1),
                            (no_softcap, "no_final_softcap (key removed)", 0.25)):
        diff = np.abs(_batched(F32, tweak) - ref)
        effect = effects[key]
        assert diff[:effect["first_row_changed"]].max(initial=0.0) < 2e-2, key
        assert float(diff.mean()) == pytest.approx(effect["mean_abs_diff"], rel=rel), key


def test_the_float64_twin_follows_llama_cpp() -> None:
    """The twin (exact maths, no f16 cache) stays within a few f16 roundings of llama.cpp, and
    the engine within the same distance of the twin."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")
    twin = Gemma4Reference(str(SYNTH3_DIR / f"{F32}.gguf"))
    ids = ref["ids"].tolist()
    ours = twin.logits(ids)
    diff = np.abs(ours - ref["logits"])
    assert diff.max() < 0.1 and diff.mean() < 5e-3
    assert int((ours.argmax(-1) == ref["logits"].argmax(-1)).sum()) >= 38
    with _load(F32) as model:  # the engine is nearer llama.cpp than the twin (f16 cache, gelu table)
        engine_diff = np.abs(model.transformer.forward([Chunk(0, ids, 0)], "all")[0] - ours)
    assert engine_diff.mean() < 5e-3


def test_a_shared_layer_reading_another_source_leaves_llama_cpp() -> None:
    """Layer 4 reading layer 1's cache instead of layer 2's (both sliding, same head dim) moves
    the logits far beyond the tolerance: the logits tests check llama.cpp's reuse map."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")["logits"]

    def other_source(tr) -> None:
        tr.hp = dataclasses.replace(tr.hp, kv_from=(0, 1, 2, 3, 1, 3))
        tr.cache = KVCache(tr.hp, 1, tr.n_ctx)  # its layout maps the layers at construction

    assert float(np.abs(_batched(F32, other_source) - ref).mean()) > 0.1


def test_shared_layers_keep_no_cache_and_the_estimate_counts_none() -> None:
    path = SYNTH3_DIR / f"{F32}.gguf"
    hp = check_servable(path)
    layout = KVLayout(hp, 128)
    cached = sorted(li for g in layout.groups for li in g.layers)
    assert cached == [0, 1, 2, 3]                     # layers 4 and 5 read 2's and 3's
    by_head_dim = {g.head_dim: g for g in layout.groups}
    assert by_head_dim[16].layers == (0, 1, 2) and by_head_dim[16].window == 8
    assert by_head_dim[32].layers == (3,) and by_head_dim[32].window == 0
    # f16 k and v: 3 sliding layers of 1 x 16 over ring + mirror rows, 1 full layer of 32 x 128
    ring = by_head_dim[16].rows
    assert layout.bytes_per_slot() == 2 * 2 * (3 * ring * 16 + 128 * 32)
    assert hp.kv_bytes_per_token() == 2 * 2 * (3 * 16 + 32)
    with _load(F32, n_slots=2) as model:
        assert model.transformer.cache.nbytes == 2 * layout.bytes_per_slot()
        k4, _, _ = model.transformer.cache.layer(4)
        k2, _, _ = model.transformer.cache.layer(2)
        assert np.shares_memory(k4, k2)
    base = estimate_memory(path, 128, 2)
    assert base - estimate_memory(path, 128, 1) == layout.bytes_per_slot()


def test_per_layer_ffn_widths_and_kv_heads_match_llama_cpp(tmp_path) -> None:
    """A file with llama.cpp's per-layer arrays (feed_forward_length wider on the shared
    layers, attention.head_count_kv 2 on the full ones), made from the committed F32 file: the
    header gives each layer its own, the cache keeps 2 heads for the full layers, and the logits
    match llama.cpp's for the same file (gemma4_per_layer_logits.npz, batched and one token at
    a time; tolerance by the manifest's rule: max(floor, 3 x llama.cpp's own gap)) and follow
    the float64 twin."""
    ref = np.load(SYNTH3_DIR / "gemma4_per_layer_logits.npz")
    path = write_per_layer_variant(SYNTH3_DIR / f"{F32}.gguf", tmp_path / "per_layer.gguf")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(ref["sha256"])  # llama.cpp's file
    hp = check_servable(path)
    assert [hp.layer_n_ff(li) for li in range(6)] == N_FF and hp.n_ff == max(N_FF)
    assert [hp.layer_n_head_kv(li) for li in range(6)] == N_HEAD_KV
    ids = ref["ids"].tolist()
    with engine.load(path, n_ctx=128, n_threads=2, flash_attn=False, n_slots=3) as model:
        tr = model.transformer
        assert tr.cache.layer(3)[0].shape[2:] == (2, 32) and tr.cache.layer(0)[0].shape[2:] == (1, 16)
        fused = tr.forward([Chunk(0, ids, 0)], "all")[0]
        eager = tr.forward_eager([Chunk(1, ids, 0)], "all")[0]
        sequential = np.stack([tr.forward([Chunk(2, [t], i)], "last")[0] for i, t in enumerate(ids)])
    np.testing.assert_array_equal(fused, eager)
    gap = np.abs(ref["logits"] - ref["logits_sequential"])
    tol = {"max_abs": max(2e-2, 3 * float(gap.max())), "mean_abs": max(2e-3, 3 * float(gap.mean())),
           "top1_agree_min": 38}
    assert_within(fused, ref["logits"], tol, "per-layer arrays, batched")
    assert_within(sequential, ref["logits_sequential"], tol, "per-layer arrays, sequential")
    twin = np.abs(fused - Gemma4Reference(str(path)).logits(ids))
    assert twin.max() < 0.1 and twin.mean() < 5e-3


def test_a_quantized_per_layer_projection_matches_llama_cpp(tmp_path) -> None:
    """per_layer_model_proj in Q8_0 (llama_model_quantize kept it F32 in the synth file; a real
    file may quantize it): the prologue's per-layer row slices are then quantized rows, and the
    logits match llama.cpp's for that file (gemma4_q8_projection_logits.npz) within the Q8_0
    tolerance, batched and one token at a time."""
    ref = np.load(SYNTH3_DIR / "gemma4_q8_projection_logits.npz")
    q8 = "gemma4_d64_l6_ple_kvshare_q8_0"
    path = write_quantized_projection_variant(SYNTH3_DIR / f"{q8}.gguf", tmp_path / "q8proj.gguf")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(ref["sha256"])
    ids = ref["ids"].tolist()
    with engine.load(path, n_ctx=128, n_threads=2, flash_attn=False, n_slots=3) as model:
        tr = model.transformer
        assert tr.weights.extra["ple_model_proj"].qtype.name == "Q8_0"
        fused = tr.forward([Chunk(0, ids, 0)], "all")[0]
        eager = tr.forward_eager([Chunk(1, ids, 0)], "all")[0]
        sequential = np.stack([tr.forward([Chunk(2, [t], i)], "last")[0] for i, t in enumerate(ids)])
    np.testing.assert_array_equal(fused, eager)
    tol = ENTRIES[q8]["suggested_tolerance"]
    assert_within(fused, ref["logits"], tol, "Q8_0 projection, batched")
    assert_within(sequential, ref["logits_sequential"], tol, "Q8_0 projection, sequential")
