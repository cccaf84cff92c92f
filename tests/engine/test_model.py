"""The engine's forward pass on tiny random-weight models, every tensor type, against the plain
numpy reference in tests/support/reference_model.py (gguf-py's dequantization, float64, no KV cache)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import engine
from engine.model import Chunk
from tests.support.ggufgen import tensor_type_field, write_tiny_llama
from tests.support.reference_model import ReferenceModel

SUPER_BLOCKS = {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS}  # rows of 256-value blocks
ALL_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.Q2_K, Q.Q3_K,
             Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS]
PROMPT = "hello world, the quick brown fox"


def _write(tmp: Path, qtype: Q, **kw) -> Path:
    dims = dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=2) if qtype in SUPER_BLOCKS else {}
    return write_tiny_llama(tmp / f"tiny-{qtype.name}.gguf", qtype=qtype, **{**dims, **kw})


def _assert_close(ours: np.ndarray, ref: np.ndarray) -> None:
    """Same logits up to the engine's 8-bit activations and f16 KV cache."""
    scale = np.abs(ref).max()
    err = np.abs(ours - ref).max()
    corr = np.corrcoef(ours.ravel(), ref.ravel())[0, 1]
    assert err <= 0.05 * scale, f"max |diff| {err:.4f} vs logit scale {scale:.3f}"
    assert corr >= 0.999, f"correlation {corr:.5f}"
    # top-1 must agree wherever the reference's top two are further apart than twice the error
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * err
    assert np.array_equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda q: q.name)
def test_forward_matches_numpy_reference(tmp_path: Path, qtype: Q) -> None:
    path = _write(tmp_path, qtype)
    with engine.load(path, n_ctx=64, n_threads=1) as model:
        ids = model.tokenizer.encode(PROMPT)
        ours = model.logits(ids)
    ref = ReferenceModel(str(path)).logits(ids)
    assert ours.shape == ref.shape
    _assert_close(ours, ref)


def test_separate_output_matrix_and_mixed_types(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "mixed.gguf", qtype=Q.Q4_1, output_qtype=Q.Q6_K,
                            tied_output=False, n_embd=256, n_ff=512)
    with engine.load(path, n_ctx=64, n_threads=2) as model:
        ids = model.tokenizer.encode(PROMPT)
        ours = model.logits(ids)
    _assert_close(ours, ReferenceModel(str(path)).logits(ids))


def test_k_quant_models_run_repacked_and_the_estimate_counts_it(tmp_path: Path) -> None:
    """On AVX-512 VNNI hosts a Q6_K model's matrices (the output too) are repacked; the memory
    estimate counts exactly what the load holds, and the logits are the reference model's."""
    from engine.formats.repack import RepackedMatrix
    from engine.kernels.gemm.facade import host_isa
    path = write_tiny_llama(tmp_path / "q6k.gguf", qtype=Q.Q6_K, tied_output=False,
                            n_embd=256, n_ff=512, n_merges=45)  # a vocabulary of 3 + 256 + 45 = 304 = 19 * 16
    with engine.load(path, n_ctx=64, n_threads=2) as model:
        w = model.transformer.weights
        assert w.output.n_rows % 16 == 0
        for m in (w.output, w.layers[0].w_down, w.layers[1].wq):
            assert isinstance(m, RepackedMatrix) == (host_isa() == "vnni512")
        assert engine.estimate_memory(path, 64) == model.memory_bytes
        ids = model.tokenizer.encode(PROMPT)
        ours = model.logits(ids)
    _assert_close(ours, ReferenceModel(str(path)).logits(ids))


@pytest.fixture(scope="module")
def q8(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_llama(tmp_path_factory.mktemp("m") / "q8.gguf", qtype=Q.Q8_0, n_layer=3)
    model = engine.load(path, n_ctx=128, n_threads=2, n_slots=3)
    yield model
    model.close()


def test_decode_steps_against_kv_cache_equal_full_evaluation(q8) -> None:
    ids = q8.tokenizer.encode(PROMPT)
    full = q8.logits(ids)                                  # [T, n_vocab], one batched pass
    tr = q8.transformer
    tr.cache.tokens[1] = []
    first = tr.forward([Chunk(1, ids[:5], 0)], "all")[0]
    steps = [tr.forward([Chunk(1, [t], 5 + i)], "last")[0] for i, t in enumerate(ids[5:])]
    stepped = np.concatenate([first, np.stack(steps)])
    np.testing.assert_allclose(stepped, full, atol=2e-3 * np.abs(full).max())


def test_batched_sequences_equal_separate_runs(q8) -> None:
    a = q8.tokenizer.encode("the lazy dog")
    b = q8.tokenizer.encode("hello there! what is the capital")
    tr = q8.transformer
    alone_a = q8.logits(a)[-1]
    alone_b = q8.logits(b)[-1]
    tr.cache.tokens[1] = []
    tr.cache.tokens[2] = []
    la, lb = tr.forward([Chunk(1, a, 0), Chunk(2, b, 0)], "last")
    np.testing.assert_allclose(la, alone_a, atol=1e-4 * np.abs(alone_a).max())
    np.testing.assert_allclose(lb, alone_b, atol=1e-4 * np.abs(alone_b).max())


def test_chunks_without_logits_skip_them_and_change_nothing_else(q8) -> None:
    """A prompt's early chunk asks for no logits: its entry is empty, and what the later
    chunk and a sequence beside it compute is the same bits as with all logits computed."""
    a = q8.tokenizer.encode(PROMPT)
    b = q8.tokenizer.encode("the lazy dog")
    tr = q8.transformer
    runs = []
    for want in (True, False):
        tr.cache.tokens[1] = []
        tr.cache.tokens[2] = []
        first = tr.forward([Chunk(1, a[:4], 0, logits=want), Chunk(2, b, 0)], "last")
        rest = tr.forward([Chunk(1, a[4:], 4)], "last")[0]
        runs.append((first, rest))
    (with_all, rest_all), (without, rest_without) = runs
    assert without[0].size == 0 and with_all[0].shape == (tr.hp.n_vocab,)
    np.testing.assert_array_equal(without[1], with_all[1])
    np.testing.assert_array_equal(rest_without, rest_all)
    tr.cache.tokens[1] = []  # no chunk wants logits at all: the output matmul has no rows
    assert [o.size for o in tr.forward([Chunk(1, a[:4], 0, logits=False)], "last")] == [0]
    np.testing.assert_array_equal(tr.forward([Chunk(1, a[4:], 4)], "last")[0], rest_all)
    tr.cache.tokens[1] = []  # the eager twin does the same
    assert tr.forward_eager([Chunk(1, a[:4], 0, logits=False)], "last")[0].size == 0
    np.testing.assert_array_equal(tr.forward_eager([Chunk(1, a[4:], 4)], "last")[0], rest_all)


def test_prefix_reuse_gives_same_continuation(q8) -> None:
    ids = q8.tokenizer.encode(PROMPT)
    q8.transformer.cache.tokens[0] = []  # whatever earlier tests left there: a fresh context
    fresh = list(q8.generate(ids, max_tokens=8, stop_at_eog=False))
    assert q8.transformer.cache.tokens[0][:len(ids)] == ids
    again = list(q8.generate(ids, max_tokens=8, stop_at_eog=False))  # slot already holds ids
    assert fresh == again


def test_seeded_generation_is_reproducible(q8) -> None:
    ids = q8.tokenizer.encode(PROMPT)
    a = list(q8.generate(ids, max_tokens=12, temperature=1.0, seed=7, stop_at_eog=False))
    b = list(q8.generate(ids, max_tokens=12, temperature=1.0, seed=7, stop_at_eog=False))
    assert a == b


def test_generation_stops_before_end_of_generation_tokens(q8) -> None:
    ids = q8.tokenizer.encode(PROMPT)
    eos = q8.tokenizer.eos_id
    forced = {"logit_bias": {eos: 100.0}}
    assert list(q8.generate(ids, max_tokens=5, **forced)) == []
    assert list(q8.generate(ids, max_tokens=5, stop_at_eog=False, **forced)) == [eos] * 5
    banned = list(q8.generate(ids, max_tokens=20, stop_at_eog=False,
                              logit_bias=dict.fromkeys(q8.tokenizer.eog_ids, -100.0)))
    assert len(banned) == 20 and not set(banned) & q8.tokenizer.eog_ids


def test_context_overflow(q8) -> None:
    with pytest.raises(engine.ContextOverflowError):
        list(q8.generate([5] * 128, max_tokens=1))
    # a prompt that fits stops at the end of the context instead of failing
    out = list(q8.generate([5] * 120, max_tokens=50, stop_at_eog=False))
    assert len(out) == 128 - 120 + 1


def test_embeddings_are_unit_vectors(q8) -> None:
    v = q8.embed(q8.tokenizer.encode(PROMPT))
    assert v.shape == (q8.n_embd,)
    assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)


def test_shape_mismatch_is_a_load_error(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "bad.gguf", qtype=Q.F32)
    data = bytearray(path.read_bytes())
    key = b"llama.feed_forward_length"
    pos = data.index(key) + len(key) + 4  # skip the u32 value type
    data[pos:pos + 4] = (999).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(engine.ModelLoadError, match=r"ffn_gate.weight has shape"):
        engine.load(path, n_ctx=32)


@pytest.mark.parametrize("tensor", ["blk.0.attn_q.weight", "output_norm.weight"])
def test_unsupported_tensor_type_is_a_load_error(tmp_path: Path, tensor: str) -> None:
    """A matrix or a norm vector in a type the engine has no kernel for (I32: same size as F32,
    so the file itself stays valid) is named in the error."""
    path = write_tiny_llama(tmp_path / "i32.gguf", qtype=Q.F32)
    data = bytearray(path.read_bytes())
    type_at = tensor_type_field(bytes(data), tensor)
    assert int.from_bytes(data[type_at:type_at + 4], "little") == Q.F32
    data[type_at:type_at + 4] = int(Q.I32).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(engine.ModelLoadError, match=f"{tensor}: type I32 is not supported"):
        engine.load(path, n_ctx=32)


def test_truncated_model_is_a_load_error(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", qtype=Q.Q4_0)
    data = path.read_bytes()
    for cut in (len(data) // 3, len(data) - 7):
        path.write_bytes(data[:cut])
        with pytest.raises(engine.ModelLoadError, match=str(path)):
            engine.load(path, n_ctx=32)


def test_split_model_loads_and_equals_the_whole_file(tmp_path: Path) -> None:
    whole = write_tiny_llama(tmp_path / "whole.gguf", qtype=Q.Q8_0)
    first = write_tiny_llama(tmp_path / "split.gguf", qtype=Q.Q8_0, split_max_tensors=6)
    with engine.load(whole, n_ctx=32) as a, engine.load(first, n_ctx=32) as b:
        ids = a.tokenizer.encode(PROMPT)
        assert np.array_equal(a.logits(ids), b.logits(ids))
        assert b.memory_bytes > a.memory_bytes - 1  # every part is counted
        # the registry's budget estimate, from the first header alone, says the same
        assert engine.estimate_memory(whole, 32) == a.memory_bytes
        assert engine.estimate_memory(first, 32) == b.memory_bytes
