"""qwen2, qwen3, phi3, gemma2 and gemma3 against llama.cpp, on the tiny random-weight models of
tests/data/synth (README there: how they were made, each family's rules, how close is close).

llama.cpp made these references with flash attention off, so the engine runs them with
flash_attn=False (its attention_rounded path: q and the probabilities rounded to f16, as ggml's
plain path does); the tolerances are the manifest's own. The float64 reference of
tests/support/reference_model.py checks the same rules independently of both.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.model import Chunk
from tests.support.llama_cpp_checks import assert_greedy_until_a_near_tie, assert_within
from tests.support.reference_model import ReferenceModel
from tests.support.refs import SYNTH_DIR

MANIFEST = json.loads((SYNTH_DIR / "manifest.json").read_text())
ENTRIES = {e["file"][:-len(".gguf")]: e for e in MANIFEST["models"] if e["arch"] != "llama"}


def _load(name: str, **kw) -> engine.Model:
    return engine.load(SYNTH_DIR / f"{name}.gguf", n_ctx=kw.pop("n_ctx", 128), n_threads=2,
                       flash_attn=kw.pop("flash_attn", False), **kw)


@pytest.mark.parametrize("name", list(ENTRIES))
def test_logits_match_llama_cpp_batched_and_sequential(name: str) -> None:
    entry = ENTRIES[name]
    ref = np.load(SYNTH_DIR / f"{name}.npz")
    ids = ref["ids"].tolist()
    with _load(name, n_slots=2) as model:
        tr = model.transformer
        batched = tr.forward([Chunk(0, ids, 0)], "all")[0]                          # [40, n_vocab]
        sequential = np.stack([tr.forward([Chunk(1, [t], i)], "last")[0] for i, t in enumerate(ids)])
    tol = entry["suggested_tolerance"]
    assert_within(batched, ref["logits"], tol, f"{name} batched")
    assert_within(sequential, ref["logits_sequential"], tol, f"{name} sequential")


def test_repacked_q4_0_gives_llama_cpp_logits() -> None:
    """Where Q4_0 matrices are repacked (engine.kernels.gemm), they meet q8_0 activations with
    the offset taken off in integers, as llama.cpp pairs Q4_0: its logits to float order (the
    file layout's q8_1 pairing lands ~0.3 away, inside the manifest's tolerance)."""
    from engine.formats.ggml_types import GGMLQuantizationType
    from engine.kernels.gemm.facade import host_repacks

    if not host_repacks(GGMLQuantizationType.Q4_0):
        pytest.skip("this host keeps Q4_0 in the file's layout")
    name = "phi3_d64_fused_qkv_q4_0"
    ref = np.load(SYNTH_DIR / f"{name}.npz")
    with _load(name, n_slots=2) as model:
        ids = ref["ids"].tolist()
        batched = model.transformer.forward([Chunk(0, ids, 0)], "all")[0]
    np.testing.assert_allclose(batched, ref["logits"], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", list(ENTRIES))
def test_greedy_tokens_match_llama_cpp_until_a_near_tie(name: str) -> None:
    ref = np.load(SYNTH_DIR / f"{name}.npz")
    ids, want = ref["ids"].tolist(), ref["greedy"].tolist()
    with _load(name) as model:
        assert_greedy_until_a_near_tie(model, ids, want)


@pytest.mark.parametrize("name", [n for n in ENTRIES if n.endswith("_f32")])
def test_the_float64_reference_matches_llama_cpp(name: str) -> None:
    """The independent reference follows the same rules: it lands where the README says a
    float64 pass with exact math lands (1.3e-2 at most), with every top-1 equal."""
    ref = np.load(SYNTH_DIR / f"{name}.npz")
    ours = ReferenceModel(str(SYNTH_DIR / f"{name}.gguf")).logits(ref["ids"].tolist())
    diff = np.abs(ours - ref["logits"])
    assert diff.max() <= 1.4e-2 and diff.mean() <= 1.5e-3
    assert (ours.argmax(-1) == ref["logits"].argmax(-1)).all()


@pytest.mark.parametrize("flash_attn", [True, False])
@pytest.mark.parametrize("name", ["gemma3_d64_l6_swa8_q8_0", "gemma2_d64_l4_softcap_f32",
                                  "qwen3_d64_hd32_qknorm_f32", "phi3_d64_fused_qkv_q4_0"])
def test_fused_pass_equals_eager_pass(name: str, flash_attn: bool) -> None:
    """Each family's block is written once; the task graph and the eager twin give its bits."""
    ids = np.load(SYNTH_DIR / f"{name}.npz")["ids"].tolist()
    with _load(name, n_slots=2, flash_attn=flash_attn) as model:
        tr = model.transformer
        for chunks in ([Chunk(0, ids[:30], 0)], [Chunk(0, ids[30:], 30)], [Chunk(0, [5], 40)]):
            fused = tr.forward(chunks, "all")[0]
            eager = tr.forward_eager([Chunk(1, c.tokens, c.pos0) for c in chunks], "all")[0]
            np.testing.assert_array_equal(fused, eager)


def test_flash_attention_paths_stay_within_the_quantized_tolerance() -> None:
    """With flash_attn (the default: llama.cpp's flash-attention numerics) the same files stay
    within the quantized tolerance, a different rounding order rather than different math."""
    for name in ("gemma3_d64_l6_swa8_q8_0", "qwen2_d64_gqa2_bias_q8_0", "phi3_d64_fused_qkv_q4_0"):
        ref = np.load(SYNTH_DIR / f"{name}.npz")
        with _load(name, flash_attn=True) as model:
            ours = model.logits(ref["ids"].tolist())
        assert_within(ours, ref["logits"], ENTRIES[name]["suggested_tolerance"], name)


# -- sliding windows past the ring ----------------------------------------------------------------

GEMMA3 = "gemma3_d64_l6_swa8_f32"


def _ring_model(n_slots: int = 2, images: bool = False) -> engine.Model:
    model = _load(GEMMA3, n_ctx=1024, n_slots=n_slots, images=images)  # rings of 8 + 511 rows
    assert [g.is_ring for g in model.transformer.cache.layout.groups] == [False, True]
    return model


def _long_prompt(n: int) -> list[int]:
    return np.random.default_rng(7).integers(6, 384, n).tolist()


def test_a_ring_that_wrapped_gives_the_float64_references_logits() -> None:
    """700 tokens in chunks of 300: the local layers' ring (519 rows) wraps, the global layer
    keeps every position; the logits follow the exact float64 pass within the F32 tolerance."""
    ids = _long_prompt(700)
    with _ring_model() as model:
        tr = model.transformer
        ours = np.concatenate([tr.forward([Chunk(0, ids[a:a + 300], a)], "all")[0]
                               for a in range(0, 700, 300)])
    ref = ReferenceModel(str(SYNTH_DIR / f"{GEMMA3}.gguf")).logits(ids)
    diff = np.abs(ours - ref)
    assert diff.max() < 2e-2 and diff.mean() < 2e-3
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() > 0.97


def test_prefix_reuse_and_copies_never_read_what_a_ring_forgot() -> None:
    ids = _long_prompt(800)
    with _ring_model(n_slots=3) as model:
        tr, cache = model.transformer, model.transformer.cache
        for a in range(0, 800, 400):
            tr.forward([Chunk(0, ids[a:a + 400], a)], "last")
        fresh = [tr.forward([Chunk(1, ids[a:a + 400], a)], "last")[0] for a in (0, 400)][-1]
        # position 790 still has its window in the ring, position 100 does not
        assert cache.reusable(0, 790) == 790 and cache.reusable(0, 100) == 0
        with pytest.raises(ValueError, match="no longer holds"):
            tr.forward([Chunk(0, ids[100:110], 100)], "last")
        with pytest.raises(ValueError, match="no longer holds"):
            cache.copy_prefix(0, 2, 100)
        cache.copy_prefix(0, 2, 790)                                  # a ring is copied whole
        resumed = tr.forward([Chunk(2, ids[790:], 790)], "last")[0]
        np.testing.assert_array_equal(resumed, fresh)
        # the engine's own prefix reuse falls back to a full evaluation when the ring moved on
        assert model.transformer.cache.tokens[0] == ids
        again = model._prefill(ids[:150], 0, "last")[-1]
        np.testing.assert_array_equal(again, tr.forward([Chunk(1, ids[:150], 0)], "last")[0])


def test_a_truncated_slot_remembers_what_its_ring_overwrote() -> None:
    """Truncating a slot's tokens does not restore ring rows that later positions overwrote: a
    copy from it, or a resume, below the old high-water mark's reach is refused."""
    ids, other = _long_prompt(900), _long_prompt(1000)[900:]
    with _ring_model(n_slots=3) as model:
        tr, cache = model.transformer, model.transformer.cache
        for a in range(0, 900, 300):
            tr.forward([Chunk(0, ids[a:a + 300], a)], "last")
        assert cache.reusable(0, 600) == 600       # 900 - 519 <= 600 - 8 + 1
        cache.tokens[0] = ids[:600]                 # what the batch runner does on admission
        tr.forward([Chunk(0, other[:50], 600)], "last")
        # by the slot's tokens (650 held) position 300 would look resumable; its rows are gone
        assert cache.reusable(0, 300) == 0
        with pytest.raises(ValueError, match="no longer holds"):
            cache.copy_prefix(0, 1, 300)
        cache.copy_prefix(0, 1, 640)                # still within reach: same bits as fresh
        got = tr.forward([Chunk(1, other[40:50], 640)], "last")[0]
        fresh = [tr.forward([Chunk(2, (ids[:600] + other[:50])[a:a + 400], a)], "last")[0]
                 for a in (0, 400)][-1]
        np.testing.assert_array_equal(got, fresh)


@pytest.mark.parametrize("images", [False, True])
def test_the_ring_is_what_the_memory_estimate_counts(images: bool) -> None:
    path = SYNTH_DIR / f"{GEMMA3}.gguf"
    with _ring_model(n_slots=3, images=images) as model:
        kv = model.transformer.cache.nbytes
        per_row = 2 * 2 * 32  # f16 k and v, one kv head of 32
        ring = 8 + 512 - 1
        # 1 global, 5 local layers (a ring and its mirror: window - 1 rows; ring - 1 in a gemma3
        # load fed images, whose bidirectional image rows read a chunk ahead)
        mirror = ring - 1 if images else 8 - 1
        assert kv == 3 * per_row * (1 * 1024 + 5 * (ring + mirror))
        assert engine.estimate_memory(path, 1024, n_slots=3, images=images) == model.memory_bytes
    with _load(GEMMA3, n_ctx=64) as small:  # a context shorter than the ring: no ring at all
        assert not any(g.is_ring for g in small.transformer.cache.layout.groups)


def test_a_chunk_longer_than_the_ring_allows_is_refused() -> None:
    with _ring_model() as model:
        with pytest.raises(ValueError, match="sliding-window"):
            model.transformer.forward([Chunk(0, _long_prompt(513), 0)], "last")
        assert model.transformer.cache.tokens[0] == []


def test_unknown_tensors_are_refused_rather_than_ignored(tmp_path: Path) -> None:
    """A llama file with attention biases (which llama.cpp would add) is not silently served."""
    with pytest.raises(engine.ModelLoadError, match=r"attn_k\.bias is not part of the engine's llama"):
        _load_as(tmp_path, "qwen2_d64_gqa2_bias_f32", "llama")


def _load_as(tmp_path: Path, name: str, arch: str) -> None:
    """Copy a synth file under another architecture name (keys renamed) and load it."""
    import gguf

    r = gguf.GGUFReader(str(SYNTH_DIR / f"{name}.gguf"))
    old = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(tmp_path / "as.gguf"), arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        new_key = key.replace(f"{old}.", f"{arch}.", 1)
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(new_key, value)
        else:
            w.add_key_value(new_key, value, vtype)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed(t.shape.tolist())),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    engine.load(tmp_path / "as.gguf", n_ctx=64).close()
