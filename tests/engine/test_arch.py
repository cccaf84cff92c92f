"""Each family's hyperparameters as llama.cpp reads them (engine.hparams with engine.arch's
specs), and what the engine refuses at load rather than computes without. The facts are those
of tests/data/synth/README.md; the metadata is the synth files' own, edited per case."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.gguf import ModelLoadError, read_header
from engine.hparams import HParams
from tests.support.ggufgen import add_keys
from tests.support.refs import SYNTH_DIR


def meta_of(name: str) -> dict:
    return dict(read_header(SYNTH_DIR / f"{name}.gguf")[0])


def test_gemma3_local_layers_window_and_rope_bases():
    hp = HParams.from_metadata(meta_of("gemma3_d64_l6_swa8_f32"), "x")
    assert [hp.layer_window(i) for i in range(6)] == [8, 8, 8, 8, 8, 0]  # i % 6 < 5 is local
    assert (hp.rope_base, hp.rope_base_swa) == (1e6, 1e4)                  # freq_base_swa absent
    assert hp.embed_scale == 8.0 and hp.scale() == 1 / math.sqrt(32)
    assert (hp.attn_softcap, hp.final_softcap) == (0.0, 0.0)
    meta = meta_of("gemma3_d64_l6_swa8_f32")
    meta["gemma3.rope.freq_base_swa"] = 5e5
    assert HParams.from_metadata(meta, "x").rope_base_swa == 5e5


def test_gemma2_alternates_windows_and_reads_both_softcaps():
    hp = HParams.from_metadata(meta_of("gemma2_d64_l4_softcap_f32"), "x")
    assert [hp.layer_window(i) for i in range(4)] == [8, 0, 8, 0]
    assert (hp.attn_softcap, hp.final_softcap) == (10.0, 12.0)
    assert hp.rope_base_swa == hp.rope_base == 1e4


def test_the_27b_layer_counts_scale_attention_by_the_embedding_width():
    meta = meta_of("gemma2_d64_l4_softcap_f32")
    meta["gemma2.block_count"] = 46
    assert HParams.from_metadata(meta, "x").scale() == 1 / math.sqrt(64 // 4)


def test_other_families_have_no_windows():
    for name in ("qwen2_d64_gqa2_bias_f32", "qwen3_d64_hd32_qknorm_f32", "phi3_d64_fused_qkv_f32"):
        meta = meta_of(name)
        arch = meta["general.architecture"]
        meta[f"{arch}.attention.sliding_window"] = 16  # phi3 files declare one; llama.cpp ignores it
        hp = HParams.from_metadata(meta, "x")
        assert hp.window == 0 and hp.embed_scale == 1.0 and hp.spec.rope_neox


@pytest.mark.parametrize("key,value,match", [
    ("attention.value_length", 16, "value_length"),
    ("rope.scaling.type", "longrope", "rope scaling"),  # LongRoPE is its factor tensors
    ("attention.key_length", 20, "multiple of 8"),
    ("attention.head_count_kv", [2, 1], "per-layer"),
])
def test_what_the_engine_cannot_honour_is_refused(key, value, match):
    meta = meta_of("qwen3_d64_hd32_qknorm_f32")
    meta[f"qwen3.{key}"] = value
    if key == "rope.scaling.type":
        meta["qwen3.rope.scaling.factor"] = 4.0
    if key == "attention.key_length":
        meta["qwen3.attention.value_length"] = value
    with pytest.raises(ModelLoadError, match=match):
        HParams.from_metadata(meta, "x")


def test_an_unknown_architecture_is_named():
    meta = meta_of("qwen2_d64_gqa2_bias_f32")
    meta["general.architecture"] = "mamba"
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'mamba'.*gemma3"):
        HParams.from_metadata(meta, "x")


# -- LongRoPE (phi3) -------------------------------------------------------------------------------

def rewrite(src: Path, dst: Path, keys: dict, tensors: dict[str, np.ndarray]) -> Path:
    """A copy of a GGUF file with metadata keys set and float32 tensors added."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in keys:
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, field.contents())
        else:
            w.add_key_value(key, field.contents(), field.types[0])
    add_keys(w, keys, unsigned=True)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed(t.shape.tolist())),
                     raw_dtype=t.tensor_type)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_longrope_factors_divide_the_frequencies_short_or_long_by_context(tmp_path: Path):
    """Long factors of 2 turn every pair half as fast: the bits of linear rope scaling by 2."""
    src = SYNTH_DIR / "phi3_d64_fused_qkv_f32.gguf"
    half = 8  # n_rot 16
    roped = rewrite(src, tmp_path / "longrope.gguf", {"phi3.rope.scaling.original_context_length": 64},
                    {"rope_factors_short.weight": np.ones(half, np.float32),
                     "rope_factors_long.weight": np.full(half, 2.0, np.float32)})
    linear = rewrite(src, tmp_path / "linear.gguf", {"phi3.rope.scaling.type": "linear",
                                                     "phi3.rope.scaling.factor": 2.0}, {})
    ids = np.load(SYNTH_DIR / "phi3_d64_fused_qkv_f32.npz")["ids"].tolist()

    def logits(path: Path, n_ctx: int) -> np.ndarray:
        with engine.load(path, n_ctx=n_ctx) as m:
            return m.logits(ids)

    np.testing.assert_array_equal(logits(roped, 64), logits(src, 64))      # short: factors of 1
    long = logits(roped, 128)                                              # n_ctx > 64: long
    np.testing.assert_array_equal(long, logits(linear, 128))
    assert np.abs(long - logits(src, 128)).max() > 0.1
