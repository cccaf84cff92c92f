"""engine.kernels.moe against its numpy twins, and quants.StackedMatrix's expert views."""
from __future__ import annotations

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
