"""engine.kernels.moe against its numpy twins, and quants.StackedMatrix's expert views."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.formats import quants
from engine.formats.ggml_types import GGMLQuantizationType as T
from engine.gguf import GGUFFile
from engine.kernels import moe
from tests.support.refs import SYNTH3_DIR


def _logits(n_tokens: int, n_exp: int, seed: int) -> np.ndarray:
    """Router logits whose sorted probabilities are never within 1e-3 of each other (so the
    top-k is one answer however the softmax rounds)."""
    rng = np.random.default_rng(seed)
    rows = [rng.permutation(np.arange(n_exp) * 0.05 + rng.normal(0, 2)) for _ in range(n_tokens)]
    return (np.array(rows) + rng.normal(0, 0.01, (n_tokens, n_exp))).astype(np.float32)


@pytest.mark.parametrize("n_exp, k", [(8, 2), (8, 1), (8, 8), (128, 8), (60, 4)])
def test_route_picks_the_top_k_of_the_softmax_and_renormalises(n_exp: int, k: int) -> None:
    logits = _logits(33, n_exp, seed=n_exp + k)
    ids, weights = moe.route(logits, k)
    want_ids, want_weights = moe.route_reference(logits, k)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(weights, want_weights, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    assert (np.diff(weights, axis=-1) <= 0).all()            # largest first


def test_route_breaks_a_tie_for_the_lower_expert_and_refuses_k_beyond_the_experts() -> None:
    ids, weights = moe.route(np.array([[1.0, 3.0, 3.0, 0.0]], np.float32), 2)
    assert ids.tolist() == [[1, 2]] and weights.tolist() == [[0.5, 0.5]]
    with pytest.raises(ValueError):
        moe.route(np.zeros((1, 4), np.float32), 5)


def test_group_sorts_the_pairs_by_expert_stably_with_padded_runs() -> None:
    rng = np.random.default_rng(3)
    ids = np.stack([rng.choice(16, 4, replace=False) for _ in range(50)])  # [50, 4]
    ids[:, 0] = 7                                                          # a crowded expert
    got, want = moe.group(ids, 16), moe.group_reference(ids, 16)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    offsets, padded, rows, pos = got
    assert offsets[-1] == 200 and (padded % moe.PAD_ROWS == 0).all()
    assert (rows[pos] == np.arange(50)[:, None]).all()       # each pair's grouped row holds its token
    assert (np.diff(padded) >= np.diff(offsets)).all()
    assert (np.diff(offsets)[[e for e in range(16) if e not in ids]] == 0).all()


def test_gather_copies_rows_and_combine_adds_the_weighted_outputs_in_order() -> None:
    rng = np.random.default_rng(4)
    src = rng.normal(size=(9, 37)).astype(np.float32)       # 37: the vectors' scalar tail too
    rows = rng.integers(0, 9, 20)
    np.testing.assert_array_equal(moe.gather(src, rows), src[rows])
    eo = rng.normal(size=(30, 37)).astype(np.float32)
    pos = rng.integers(0, 30, (10, 3))
    w = rng.random((10, 3)).astype(np.float32)
    out = moe.combine(eo, pos, w)
    np.testing.assert_allclose(out, moe.combine_reference(eo, pos, w), rtol=1e-6, atol=1e-6)
    in_order = w[:, 0, None] * eo[pos[:, 0]] + w[:, 1, None] * eo[pos[:, 1]]
    np.testing.assert_array_equal(out, in_order + w[:, 2, None] * eo[pos[:, 2]])  # float32, j order


@pytest.mark.parametrize("name", ["qwen3moe_d64_e8k2_f32", "qwen3moe_d64_e8k2_q8_0"])
def test_an_expert_is_a_view_of_its_rows_of_the_stacked_tensor(name: str) -> None:
    from gguf import GGUFReader, dequantize

    f = GGUFFile(SYNTH3_DIR / f"{name}.gguf")
    try:
        info = f.tensors["blk.1.ffn_down_exps.weight"]
        n_cols, n_rows, n_mat = info.shape
        raw = f.tensor_data(info.name).reshape(n_mat, n_rows, -1)
        stack = quants.StackedMatrix(raw, info.qtype, n_mat, n_rows, n_cols)
        t = next(t for t in GGUFReader(str(SYNTH3_DIR / f"{name}.gguf")).tensors if t.name == info.name)
        whole = dequantize(t.data, t.tensor_type).reshape(n_mat, n_rows, n_cols)   # gguf-py's
        for e in (0, 5, 7):
            m = stack.matrix(e)
            assert np.shares_memory(m.raw, raw) and m.address == stack.address + e * stack.matrix_bytes
            np.testing.assert_array_equal(quants.dequantize(m.raw, m.qtype, m.n_cols), whole[e])
        assert info.qtype in (T.F32, T.Q8_0)
        with pytest.raises(ValueError):
            quants.StackedMatrix(raw[:, :3], info.qtype, n_mat, 3, n_cols)     # not contiguous
    finally:
        f.close()


# ------------------------------------------------------------------ experts repacked

def _random_stack(qtype: T, n_mat: int, n_rows: int, n_cols: int, seed: int) -> quants.StackedMatrix:
    m = quants.random_quant_matrix(qtype, n_mat * n_rows, n_cols, np.random.default_rng(seed))
    return quants.StackedMatrix(m.raw.reshape(n_mat, n_rows, -1), qtype, n_mat, n_rows, n_cols)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q4_0])
def test_a_repacked_stack_holds_each_experts_repacking_and_multiplies_as_the_twin(qtype: T) -> None:
    """prepare_stack repacks every expert into one allocation; expert e is the repacking of
    the file's expert e (the same bytes as repacking it alone) at address + e * matrix_bytes,
    and its product is the gemm twin's (engine.kernels.gemm.reference) and the same bits as
    the matrix repacked alone."""
    from engine.formats.repack import RepackedMatrix, RepackedStack, repack
    from engine.kernels.gemm.reference import reference
    from engine.kernels.matmul import MatmulKernels

    n_mat, n_rows, n_cols = 5, 48, 512   # 3 groups of 16 rows: Q4_0 / Q8_0 strides get padding
    stack = _random_stack(qtype, n_mat, n_rows, n_cols, seed=qtype.value)
    x = np.random.default_rng(1).normal(0, 1, (3, n_cols)).astype(np.float32)
    with MatmulKernels([qtype]) as mk:
        packed = mk.prepare_stack(stack)
        if not isinstance(packed, RepackedStack):
            assert not mk.repacks(stack.matrix(0))
            pytest.skip("models keep this type in the file's layout on this host")
        assert packed.matrix_bytes % 64 == 0 and packed.data.nbytes == n_mat * packed.matrix_bytes
        for e in range(n_mat):
            m = packed.matrix(e)
            alone = repack(stack.matrix(e))
            assert isinstance(m, RepackedMatrix) and m.address == packed.address + e * packed.matrix_bytes
            np.testing.assert_array_equal(m.data[:alone.nbytes], alone.data)
            got = mk.matmul(m, x)
            np.testing.assert_array_equal(got, mk.matmul(alone, x))
            ref = reference(stack.matrix(e), x)
            np.testing.assert_allclose(got, ref, rtol=1e-3, atol=2e-3 * np.abs(ref).max())


@pytest.fixture(scope="module")
def kquant_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen3moe with Q4_K experts (K-quants need rows of 256)."""
    from tests.support.ggufgen import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("moe") / "moe_q4_k.gguf", qtype=T.Q4_K,
                            n_embd=256, n_head=4, n_head_kv=2, experts=(8, 2, 256))


def test_repacked_experts_give_the_file_layouts_bits_fused_and_eager(
        kquant_moe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Q4_K's interleaved kernels give the file-layout kernels' bits (engine.kernels.gemm), so
    a model whose experts (and other matrices) are repacked gives the logits of the same model
    left in the file's layout, through the task graph (runs packed per expert for the gemm
    activations) and the eager twin: a prompt, then three sequences decoding together."""
    import engine
    from engine.formats.repack import RepackedStack
    from engine.kernels.gemm import facade
    from engine.model import Chunk

    steps = ([Chunk(0, list(range(3, 40)), 0)],
             [Chunk(0, [7], 37), Chunk(1, list(range(50, 59)), 0), Chunk(2, [11], 0)])

    def run() -> tuple[bool, list[list[np.ndarray]]]:
        with engine.load(kquant_moe, n_ctx=64, n_threads=2, n_slots=6) as model:
            tr = model.transformer
            repacked = isinstance(tr.weights.layers[0].gate_exps, RepackedStack)
            out = []
            for chunks in steps:
                fused = tr.forward(chunks, "all")
                eager = tr.forward_eager([Chunk(c.slot + 3, c.tokens, c.pos0) for c in chunks], "all")
                for f, e in zip(fused, eager):
                    np.testing.assert_array_equal(f, e)
                out.append(fused)
            return repacked, out

    repacked, got = run()
    if not repacked:
        pytest.skip("models keep Q4_K in the file's layout on this host")
    monkeypatch.setattr(facade, "IN_MODELS", frozenset())   # nothing repacked
    file_layout, want = run()
    assert not file_layout
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            np.testing.assert_array_equal(a, b)


def test_the_estimate_counts_the_repacked_experts(kquant_moe: Path) -> None:
    """Q4_K's repacked groups are larger than its blocks (2368 against 16 x 144 bytes): the
    header-only estimate adds what the load's repacked stacks add."""
    import engine

    with engine.load(kquant_moe, n_ctx=64, n_slots=2) as model:
        tr = model.transformer
        stacks = tr.weights.layers[0].gate_exps
        assert engine.estimate_memory(kquant_moe, 64, n_slots=2) == model.memory_bytes
        assert model.memory_bytes == kquant_moe.stat().st_size + tr.cache.nbytes + tr.repacked_bytes
        if stacks.address != int(stacks.raw.ctypes.data):            # repacked on this host
            assert tr.repacked_bytes >= 3 * 2 * 8 * (2368 - 16 * 144) * (256 // 16)
