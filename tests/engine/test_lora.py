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


