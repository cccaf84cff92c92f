"""qwen3moe, a mixture of experts, against llama.cpp on the tiny models of tests/data/synth3
(README there: how they were made, how close is close): batched, one token at a time, split in
two calls, greedy; then batched beside other sequences and served beside another model.

llama.cpp ran flash attention off, so the engine does too (as tests/test_synth_archs.py).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.batch import BatchRunner, Sequence
from engine.model import Chunk
from engine.sampling import SamplingParams
from engine.servable import check_servable, why_not_servable
from tests.support.batch_checks import alone, assert_same_or_near_tie, run_all
from tests.support.llama_cpp_checks import assert_greedy_until_a_near_tie, assert_synth_logits
from tests.support.refs import SYNTH3_DIR

MANIFEST = json.loads((SYNTH3_DIR / "manifest.json").read_text())
ENTRIES = {e["file"][:-len(".gguf")]: e for e in MANIFEST["models"] if e["arch"] == "qwen3moe"}
F32 = "qwen3moe_d64_e8k2_f32"


def _load(name: str, **kw) -> engine.Model:
    return engine.load(SYNTH3_DIR / f"{name}.gguf", n_ctx=kw.pop("n_ctx", 128), n_threads=2,
                       flash_attn=kw.pop("flash_attn", False), **kw)


def test_the_files_are_the_ones_the_manifest_describes() -> None:
    assert set(ENTRIES) == {"qwen3moe_d64_e8k2_f32", "qwen3moe_d64_e8k2_q8_0"}
    for name, entry in ENTRIES.items():
        hp = check_servable(SYNTH3_DIR / f"{name}.gguf")
        want = entry["hparams"]
        assert (hp.extra["n_expert"], hp.extra["n_expert_used"], hp.extra["n_ff_exp"]) == (
            want["n_expert"], want["n_expert_used"], want["n_ff_exp"])


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
    """The block is written once; the task graph (runs grouped by expert on the pool) and the
    eager twin (expert by expert from Python) give its bits: a prompt, its continuation, and a
    batched decode of three sequences whose tokens choose different experts."""
    ids = np.load(SYNTH3_DIR / f"{name}.npz")["ids"].tolist()
    with _load(name, n_slots=6, flash_attn=flash_attn) as model:
        tr = model.transformer
        for chunks in ([Chunk(0, ids[:30], 0)], [Chunk(0, ids[30:], 30)],
                       [Chunk(0, [5], 40), Chunk(1, ids[:7], 0), Chunk(2, [ids[3]], 0)]):
            fused = tr.forward(chunks, "all")
            eager = tr.forward_eager([Chunk(c.slot + 3, c.tokens, c.pos0) for c in chunks], "all")
            for f, e in zip(fused, eager):
                np.testing.assert_array_equal(f, e)


@pytest.mark.parametrize("n_used, effect", [(1, "top1_routing (expert_used_count 1)"),
                                             (8, "all_experts (expert_used_count 8)")])
def test_a_different_routing_moves_the_logits_as_llama_cpp_saw(n_used: int, effect: str) -> None:
    """With expert_used_count changed, our logits leave llama.cpp's by about what the manifest's
    feature_effects measured for the same change in llama.cpp (1.07 mean for 1 expert, 0.63 for
    all 8): the logits tests above would see a routing bug, and k is honoured both ways."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")
    with _load(F32) as model:
        tr = model.transformer
        tr.hp = dataclasses.replace(tr.hp, extra={**tr.hp.extra, "n_expert_used": n_used})
        ours = tr.forward([Chunk(0, ref["ids"].tolist(), 0)], "all")[0]
    moved = float(np.abs(ours - ref["logits"]).mean())
    assert moved == pytest.approx(ENTRIES[F32]["feature_effects"][effect]["mean_abs_diff"], rel=0.1)


# ------------------------------------------------------------------ servability, batching, serving

@pytest.mark.parametrize("name", list(ENTRIES))
def test_the_memory_estimate_is_the_whole_file_and_its_cache(name: str) -> None:
    """Every expert is mapped (any may be chosen next step), so the estimate counts the whole
    file, and what the repacked experts add (Q8_0's groups are its blocks' size: nothing)."""
    path = SYNTH3_DIR / f"{name}.gguf"
    with _load(name, n_slots=2) as model:
        assert engine.estimate_memory(path, 128, n_slots=2) == model.memory_bytes
        assert model.memory_bytes == path.stat().st_size + model.transformer.cache.nbytes + \
            model.transformer.repacked_bytes


def test_a_file_missing_an_expert_tensor_is_refused_from_its_header(tmp_path: Path) -> None:
    from gguf import GGUFReader, GGUFWriter

    src = GGUFReader(str(SYNTH3_DIR / f"{F32}.gguf"))
    w = GGUFWriter(str(tmp_path / "cut.gguf"), "qwen3moe")
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0],
                        field.types[-1] if len(field.types) > 1 else None)
    for t in src.tensors:
        if t.name != "blk.1.ffn_up_exps.weight":
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(reversed(t.shape.tolist())),
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert why_not_servable(tmp_path / "cut.gguf") == "tensor blk.1.ffn_up_exps.weight is missing"


GREEDY = SamplingParams(temperature=0.0)


def test_greedy_tokens_do_not_depend_on_the_batch() -> None:
    """Six sequences batched, prompts in budgeted chunks beside decodes: each gets the tokens it
    gets alone (the engine's one-sequence path)."""
    rng = np.random.default_rng(5)
    prompts = [[494, *rng.integers(0, 493, n).tolist()] for n in (5, 31, 12, 40, 3, 22)]
    with _load("qwen3moe_d64_e8k2_q8_0", n_slots=6) as model:
        expected = [alone(model, ids, GREEDY, 12) for ids in prompts]
        runner = BatchRunner(model, prefill_budget=16)
        seqs = [Sequence(ids, params=GREEDY, max_tokens=12, stop_at_eog=False) for ids in prompts]
        for seq in seqs:
            runner.submit(seq)
        run_all(runner)
        runner.close()
        for ids, want, seq in zip(prompts, expected, seqs):
            assert_same_or_near_tie(model, ids, want, seq.generated)
