"""The engine with a q8_0 / q4_0 KV cache against llama.cpp's logits with the same cache
(tests/data/kvq): ours stays within llama.cpp's own spread between that cache and f16, on the
real SmolLM2 and a synthetic qwen3; and the quantized cache holds the memory its type says."""
import numpy as np
import pytest

import engine
from engine import ModelLoadError
from tests.support.refs import DATA_DIR, SYNTH_DIR

KVQ_DIR = DATA_DIR / "kvq"


def _ours(path, ref, prompt, kv):
    ids, top = ref[f"{prompt}_ids"].tolist(), ref[f"{prompt}_top_ids"]
    with engine.load(path, n_ctx=512, n_threads=2, type_k=kv, type_v=kv) as model:
        return np.take_along_axis(model.logits(ids), top, axis=1)      # [n, 32] at llama's top ids


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_synth_logits_within_llama_cpp_spread(kv):
    """Where our f16 logits match llama.cpp's to float noise, the quantized cache's match
    llama.cpp's with that cache to a quarter of llama.cpp's own spread (f16 vs that cache)."""
    ref = np.load(KVQ_DIR / "synth_qwen3.npz")
    ours = _ours(SYNTH_DIR / "qwen3_d64_hd32_qknorm_f32.gguf", ref, "random", kv)
    spread = np.abs(ref[f"random_{kv}"] - ref["random_f16"]).max()
    assert np.abs(ours - ref[f"random_{kv}"]).max() < spread / 4


def test_smollm2_q8_0_logits_within_llama_cpp_spread(smollm2_path):
    """On SmolLM2 our f16 logits already sit ~0.9 (max) from llama.cpp's (its Q4_1 matmul
    numerics; tests/engine/test_smollm2_reference.py allows 1.6): q8_0 KV may move ours from
    llama.cpp's q8_0 logits by no more than that plus llama.cpp's own q8_0-vs-f16 spread, in
    max and in mean, and keeps the top-1 agreement."""
    ref = np.load(KVQ_DIR / "smollm2.npz")
    f16, q8 = _ours(smollm2_path, ref, "story", "f16"), _ours(smollm2_path, ref, "story", "q8_0")
    base = np.abs(f16 - ref["story_f16"])
    spread = np.abs(ref["story_q8_0"] - ref["story_f16"])
    ours = np.abs(q8 - ref["story_q8_0"])
    assert ours.max() <= base.max() + spread.max()
    assert ours.mean() <= base.mean() + spread.mean()
    assert np.mean(q8.argmax(1) == 0) >= 0.95                  # llama.cpp's f16 top-1


def test_quantized_kv_load_rules(smollm2_path):
    with pytest.raises(ModelLoadError, match="requires flash_attn"):
        engine.load(smollm2_path, n_ctx=64, type_k="q8_0", type_v="q8_0", flash_attn=False)
    with pytest.raises(ModelLoadError, match="must both be quantized"):
        engine.load(smollm2_path, n_ctx=64, type_k="q8_0")
    with pytest.raises(ModelLoadError, match="unsupported KV cache type"):
        engine.load(smollm2_path, n_ctx=64, type_k="q5_1", type_v="q5_1")
    with engine.load(smollm2_path, n_ctx=256, type_k=8, type_v=8) as q8, \
            engine.load(smollm2_path, n_ctx=256) as f16:
        assert q8.transformer.cache.nbytes * 32 == f16.transformer.cache.nbytes * 17
