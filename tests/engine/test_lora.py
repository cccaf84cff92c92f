"""LoRA adapters merged at load (engine.lora) against llama.cpp's logits with the same adapters
(tests/data/lora, made by scripts/make_lora_refs.py): one adapter at two scales and two adapters
together, on an F32 base and its Q8_0 twin, through the fused pass and its eager twin; and the
adapter files the engine must refuse, each named."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

import engine
from engine.model import Chunk
from tests.support.llama_cpp_checks import assert_within
from tests.support.refs import SYNTH_DIR

LORA_DIR = SYNTH_DIR.parent / "lora"
BASES = ("qwen2_d64_gqa2_bias_f32", "qwen2_d64_gqa2_bias_q8_0")
TOL = {e["file"][:-len(".gguf")]: e["suggested_tolerance"]
       for e in json.loads((SYNTH_DIR / "manifest.json").read_text())["models"]}


def _load(base: str, lora: list[engine.LoraSpec]) -> engine.Model:
    return engine.load(SYNTH_DIR / f"{base}.gguf", n_ctx=64, n_threads=2, n_slots=2,
                       flash_attn=False, lora=lora)


def _cases(ref: np.lib.npyio.NpzFile) -> list[tuple[str, list[engine.LoraSpec]]]:
    a, b = LORA_DIR / "adapter_a.gguf", LORA_DIR / "adapter_b.gguf"
    s, p = ref["scales"].tolist(), ref["pair_scales"].tolist()
    return [("logits_a0", [engine.LoraSpec(a, s[0])]), ("logits_a1", [engine.LoraSpec(a, s[1])]),
            ("logits_pair", [engine.LoraSpec(a, p[0]), engine.LoraSpec(b, p[1])])]


@pytest.mark.parametrize("base", BASES)
def test_logits_with_adapters_match_llama_cpp_fused_and_eager(base: str) -> None:
    ref = np.load(LORA_DIR / f"{base}.npz")
    ids = ref["ids"].tolist()
    for key, lora in _cases(ref):
        with _load(base, lora) as model:
            tr = model.transformer
            fused = tr.forward([Chunk(0, ids, 0)], "all")[0]
            eager = tr.forward_eager([Chunk(1, ids, 0)], "all")[0]
        assert_within(fused, ref[key], TOL[base], f"{base} {key} fused")
        np.testing.assert_array_equal(fused, eager)
        # the adapter matters: the plain logits are far outside the tolerance of these
        assert np.abs(ref[key] - ref["plain"]).max() > 20 * TOL[base]["max_abs"]


def test_an_f32_adapter_on_an_f32_base_is_exact_to_float_rounding() -> None:
    """adapter_b's pairs are F32, so llama.cpp's side path rounds nothing the merge does not:
    the gap is summation order only, an order of magnitude inside the F32 tolerance (adapter_a's
    F16 pairs make llama.cpp round x and A x to F16 first, which the merge cannot follow)."""
    ref = np.load(LORA_DIR / f"{BASES[0]}.npz")
    b = engine.LoraSpec(LORA_DIR / "adapter_b.gguf", float(ref["b_scale"]))
    with _load(BASES[0], [b]) as model:
        logits = model.transformer.forward([Chunk(0, ref["ids"].tolist(), 0)], "all")[0]
    assert_within(logits, ref["logits_b"], {"max_abs": 5e-3, "mean_abs": 2e-4,
                                            "top1_agree_min": 40}, "adapter_b alone")
    assert np.abs(ref["logits_b"] - ref["plain"]).max() > 1.0


@pytest.mark.parametrize("base", BASES)
def test_the_merged_matrices_are_counted_in_memory_and_its_estimate(base: str) -> None:
    a = engine.LoraSpec(LORA_DIR / "adapter_a.gguf", 1.0)
    with _load(base, []) as plain, _load(base, [a]) as adapted:
        extra = adapted.memory_bytes - plain.memory_bytes
        assert adapted.memory_bytes == engine.estimate_memory(SYNTH_DIR / f"{base}.gguf", 64,
                                                              n_slots=2, lora=[a])
    # 4 adapted matrices per layer, 2 layers, float32: attn_q 64x64, attn_v 32x64, ffn_up 128x64,
    # ffn_down 64x128
    assert extra >= 2 * 4 * (64 * 64 + 32 * 64 + 128 * 64 + 64 * 128)


def _write_adapter(path: Path, arch: str = "qwen2", general_type: str = "adapter",
                   tensors: dict[str, tuple[int, int]] | None = None) -> Path:
    """An adapter file: tensors maps a base tensor to (n_cols, n_rows) for rank-2 A/B."""
    w = GGUFWriter(str(path), arch)
    w.add_string("general.type", general_type)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 4.0)
    for name, (n_cols, n_rows) in (tensors or {"blk.0.attn_q.weight": (64, 64)}).items():
        w.add_tensor(name + ".lora_a", np.zeros((2, n_cols), np.float32))
        w.add_tensor(name + ".lora_b", np.zeros((n_rows, 2), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("make, problem", [
    (lambda d: d / "missing.gguf", "not found"),
    (lambda d: _write_adapter(d / "x.gguf", general_type="model"), "not a LoRA adapter"),
    (lambda d: _write_adapter(d / "x.gguf", arch="llama"), "a LoRA adapter for 'llama'"),
    (lambda d: _write_adapter(d / "x.gguf", tensors={"blk.0.attn_q.weight": (64, 96)}),
     "do not fit"),
    (lambda d: _write_adapter(d / "x.gguf", tensors={"blk.7.attn_q.weight": (64, 64)}),
     "which the model does not have"),
    (lambda d: _write_adapter(d / "x.gguf", tensors={"token_embd.weight": (64, 496)}),
     "not supported"),
])
def test_bad_adapters_are_refused_naming_the_file(tmp_path: Path, make, problem: str) -> None:
    path = make(tmp_path)
    with pytest.raises(engine.ModelLoadError, match=problem) as e:
        _load(BASES[0], [engine.LoraSpec(path)]).close()
    assert e.value.path == str(path)


def test_a_zero_delta_adapter_leaves_the_logits_exactly(tmp_path: Path) -> None:
    zero = _write_adapter(tmp_path / "zero.gguf")
    ids = np.load(LORA_DIR / f"{BASES[0]}.npz")["ids"].tolist()
    with _load(BASES[0], []) as plain, _load(BASES[0], [engine.LoraSpec(zero, 3.0)]) as adapted:
        np.testing.assert_array_equal(adapted.transformer.forward([Chunk(0, ids, 0)], "all")[0],
                                      plain.transformer.forward([Chunk(0, ids, 0)], "all")[0])




# -- other scales per chunk: the side path (engine.lora_side) ---------------------------------

def test_lora_side_path_is_the_difference_of_merges() -> None:
    """The numpy side path against its definition: B (A x) per row, scaled by the row's offset."""
    from engine.lora import LoraDelta
    from engine.lora_side import add_side_path, offsets, row_offsets

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    d = LoraDelta(a, b, 0.5, adapter=1, unit=0.25)
    rows = row_offsets([offsets((1.0, 2.0), (1.0, 0.5)), None], [(0, 3), (3, 4)], 2)
    assert rows is not None and rows[:, 1].tolist() == [1.5, 1.5, 1.5, 0.0]
    y = np.zeros((4, 5), np.float32)
    add_side_path(y, x, [d], rows)
    want = (x.astype(np.float64) @ a.T @ b.T) * 0.25 * np.array([1.5, 1.5, 1.5, 0.0])[:, None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert offsets((1.0, 0.5), (1.0, 0.5)) is None and offsets(None, (1.0,)) is None
    with pytest.raises(ValueError):
        offsets((1.0,), (1.0, 0.5))


@pytest.mark.parametrize("base", BASES)
def test_per_chunk_scales_match_llama_cpp_at_those_scales(base: str) -> None:
    """Adapters merged at one set of scales, chunks asking others (llama-server's per-request
    `lora`) in one batch: each chunk's logits are llama.cpp's at its own scales, and a chunk
    asking the merged scales is the fused pass's, bit for bit."""
    ref = np.load(LORA_DIR / f"{base}.npz")
    ids = ref["ids"].tolist()
    s, p, b_scale = ref["scales"].tolist(), ref["pair_scales"].tolist(), float(ref["b_scale"])
    a, b = LORA_DIR / "adapter_a.gguf", LORA_DIR / "adapter_b.gguf"
    with engine.load(SYNTH_DIR / f"{base}.gguf", n_ctx=64, n_threads=2, n_slots=4,
                     flash_attn=False, lora=[engine.LoraSpec(a, s[0])]) as model:
        tr = model.transformer
        merged = tr.forward([Chunk(0, ids, 0)], "all")[0]
        other, off, same = tr.forward([Chunk(1, ids, 0, lora=[s[1]]), Chunk(2, ids, 0, lora=[0.0]),
                                       Chunk(3, ids, 0, lora=[s[0]])], "all")
    assert_within(other, ref["logits_a1"], TOL[base], f"{base} a at {s[1]} over {s[0]}")
    assert_within(off, ref["plain"], TOL[base], f"{base} a at 0 over {s[0]}")
    np.testing.assert_array_equal(same, merged)
    with engine.load(SYNTH_DIR / f"{base}.gguf", n_ctx=64, n_threads=2, n_slots=2,
                     flash_attn=False, lora=[engine.LoraSpec(a, 0.0), engine.LoraSpec(b, 0.0)]) as model:
        pair, b_only = model.transformer.forward(
            [Chunk(0, ids, 0, lora=p), Chunk(1, ids, 0, lora=[0.0, b_scale])], "all")
    assert_within(pair, ref["logits_pair"], TOL[base], f"{base} pair over zero scales")
    assert_within(b_only, ref["logits_b"], TOL[base], f"{base} b alone over zero scales")


def test_per_chunk_scales_in_last_row_logits() -> None:
    """`last` logits (the output rows gathered) carry each chunk's own side path too."""
    ref = np.load(LORA_DIR / f"{BASES[0]}.npz")
    ids, s = ref["ids"].tolist(), ref["scales"].tolist()
    with _load(BASES[0], [engine.LoraSpec(LORA_DIR / "adapter_a.gguf", s[0])]) as model:
        lo, hi = model.transformer.forward([Chunk(0, ids, 0, lora=[s[1]]), Chunk(1, ids, 0, logits=3)],
                                           "last")
    assert_within(lo[None], ref["logits_a1"][-1:], TOL[BASES[0]], "last row at the other scale",
                  top1_min=1)
    assert_within(hi, ref["logits_a0"][-3:], TOL[BASES[0]], "last rows at the merged scale",
                  top1_min=3)


def test_batched_sequences_at_different_scales_and_their_prompt_cache() -> None:
    """BatchRunner: sequences asking different scales decode together, each as a load merged at
    its own scales decodes alone; a slot's cached prompt is reused only at the same scales."""
    from engine.batch import BatchRunner, Sequence
    from engine.sampling import SamplingParams

    ref = np.load(LORA_DIR / f"{BASES[1]}.npz")
    ids, s = ref["ids"].tolist()[:24], ref["scales"].tolist()
    a = LORA_DIR / "adapter_a.gguf"
    greedy = SamplingParams(temperature=0.0)

    def alone(scale: float) -> list[int]:
        with _load(BASES[1], [engine.LoraSpec(a, scale)]) as m:
            r = BatchRunner(m)
            seq = Sequence(ids, params=greedy, max_tokens=12, stop_at_eog=False)
            r.submit(seq)
            while r.busy:
                r.step()
            return seq.generated

    want = {scale: alone(scale) for scale in (s[0], s[1], 0.0)}
    assert len(set(map(tuple, want.values()))) == 3  # the scales change the text
    with _load(BASES[1], [engine.LoraSpec(a, s[0])]) as m:
        r = BatchRunner(m)
        seqs = [Sequence(ids, params=greedy, max_tokens=12, stop_at_eog=False,
                         lora=None if scale == s[0] else (scale,)) for scale in want]
        for q in seqs:
            r.submit(q)
        while r.busy:
            r.step()
        assert [q.generated for q in seqs] == list(want.values())
        again = [Sequence(ids, params=greedy, max_tokens=12, stop_at_eog=False, lora=(0.0,)),
                 Sequence(ids, params=greedy, max_tokens=12, stop_at_eog=False, lora=(0.9,))]
        for q in again:
            r.submit(q)
        while r.busy:
            r.step()
        assert again[0].cached > 0 and again[0].generated == want[0.0]  # its own slot's prompt
        assert again[1].cached == 0  # no slot holds the prompt at 0.9
