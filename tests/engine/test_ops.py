"""The compiled glue kernels against their float64 numpy twins and independent formulations."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llvmlite import ir

from engine.kernels import ops, rotary
from engine.kernels.ir import builder
from engine.kernels.jit import compile_ir

SIZES = [1, 7, 8, 13, 576, 1537]  # below, at and past one vector; odd tails


def rand(shape, seed, scale=1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# -- building blocks ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vector_exp():
    """builder.exp compiled on its own: out[i] = exp(x[i]), vector body plus scalar tail."""
    module = builder.new_module("exp_test")
    b, (x, out, n) = builder.define(module, "exp_all", ir.VoidType(),
                                [("x", builder.F32P), ("out", builder.F32P), ("n", builder.I64)])
    builder.elementwise(
        b, n, lambda j, ty: builder.store(b, builder.exp(b, builder.load(b, x, j, ty)), out, j))
    b.ret_void()
    fn = compile_ir(str(module)).function("exp_all", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    def run(values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values, dtype=np.float32)
        result = np.empty_like(values)
        fn(values.ctypes.data, result.ctypes.data, values.size)
        return result

    return run


def test_exp_relative_error_is_float_level(vector_exp):
    x = np.linspace(-87, 88, 200_003, dtype=np.float32)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(vector_exp(x) / want - 1)) < 5e-7


def test_exp_edges(vector_exp):
    x = np.array([0, -0.0, 1, -1, -87.5, -200, -np.inf, 100, np.inf, np.nan, 1e-30], np.float32)
    got = vector_exp(x)
    assert got[0] == 1 and got[1] == 1
    np.testing.assert_allclose(got[2:4], np.exp(x[2:4]), rtol=3e-7)
    assert (got[4:7] == 0).all()                    # underflow -> exactly 0
    assert np.isfinite(got[7:9]).all() and (got[7:9] > 1e38).all()  # saturates, no inf
    assert np.isnan(got[9]) and got[10] == 1


# -- rms_norm ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("rows", [1, 5])
def test_rms_norm_matches_twin(n, rows):
    x, w = rand((rows, n), n), rand(n, n + 1)
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-5), ops.rms_norm_reference(x, w, 1e-5),
                               rtol=2e-6, atol=1e-6)


def test_rms_norm_in_place_and_definition():
    x, w = rand((3, 576), 1, scale=30), rand(576, 2)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    got = ops.rms_norm(x, w, 1e-6, out=x)
    assert got is x
    np.testing.assert_allclose(x, want, rtol=2e-6, atol=1e-6)


def test_rms_norm_eps_matters_for_tiny_rows():
    x = np.full((1, 16), 1e-4, np.float32)
    w = np.ones(16, np.float32)
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-5), x / np.sqrt(1e-8 + 1e-5), rtol=1e-6)


# -- rope ------------------------------------------------------------------------------------------

def rope_complex(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float) -> np.ndarray:
    """Independent formulation: pair (x[2i], x[2i+1]) is the complex number x[2i] + j x[2i+1],
    multiplied by e^(j pos / base^(2i/n_rot)); dims past n_rot untouched."""
    i = np.arange(n_rot // 2)
    freq = 1.0 / np.power(float(base), 2.0 * i / n_rot)
    rot = np.exp(1j * np.outer(np.asarray(positions, np.float64), freq))[:, None, :]  # [M, 1, n_rot/2]
    z = (x[..., 0:n_rot:2].astype(np.float64) + 1j * x[..., 1:n_rot:2]) * rot
    y = x.astype(np.float64)
    y[..., 0:n_rot:2], y[..., 1:n_rot:2] = z.real, z.imag
    return y


@pytest.mark.parametrize("head_dim,n_rot", [(64, 64), (128, 128), (64, 32), (64, 6), (10, 10)])
def test_rope_matches_complex_rotation_and_twin(head_dim, n_rot):
    x = rand((6, 5, head_dim), head_dim + n_rot)
    pos = np.array([0, 1, 2, 17, 511, 3000])
    got = rotary.rope(x, pos, n_rot, 100000.0)
    np.testing.assert_allclose(got, rope_complex(x, pos, n_rot, 100000.0), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(got, rotary.rope_reference(x, pos, n_rot, 100000.0), rtol=1e-5, atol=2e-6)
    assert np.array_equal(got[..., n_rot:], x[..., n_rot:])
    assert np.array_equal(got[0], x[0])  # position 0 is the identity


def test_rope_rotates_adjacent_pairs_not_halves():
    """GGML_ROPE_TYPE_NORM: dims 0 and 1 form the first (fastest) pair."""
    x = np.zeros((1, 1, 8), np.float32)
    x[0, 0, 0] = 1.0
    got = rotary.rope(x, np.array([1]), 8, 10000.0)[0, 0]
    np.testing.assert_allclose(got[:2], [np.cos(1.0), np.sin(1.0)], rtol=1e-6)
    assert not got[2:].any()


def test_rope_scores_depend_on_relative_position_only():
    q, k = rand((1, 1, 64), 10), rand((1, 1, 64), 11)

    def score(m: int, n: int) -> float:
        qm = rotary.rope(q, np.array([m]), 64, 10000.0).ravel()
        return float(qm @ rotary.rope(k, np.array([n]), 64, 10000.0).ravel())

    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-5)
    assert score(7, 3) != pytest.approx(score(8, 3), rel=1e-3)


def test_rope_in_place_and_far_positions_grow_the_table():
    x = rand((3, 2, 64), 12)
    want = rope_complex(x, np.array([5, 9000, 70000]), 64, 10000.0)
    got = rotary.rope(x, np.array([5, 9000, 70000], np.int32), 64, 10000.0, out=x)
    assert got is x
    np.testing.assert_allclose(x, want, rtol=1e-4, atol=1e-5)


def test_rope_accepts_inverse_frequencies():
    """An array instead of a base: the theta_i themselves (freq factors, linear scaling)."""
    x = rand((4, 3, 64), 13)
    pos = np.array([0, 3, 50, 700])
    from_base = 10000.0 ** (-np.arange(0, 64, 2) / 64)
    assert np.array_equal(rotary.rope(x, pos, 64, from_base), rotary.rope(x, pos, 64, 10000.0))
    factors = np.linspace(1.0, 8.0, 32)  # llama3-style per-pair freq factors, times a 0.5 scale
    theta = (from_base / factors * 0.5).astype(np.float32)
    z = (x[..., 0::2].astype(np.float64) + 1j * x[..., 1::2]) * np.exp(1j * np.outer(pos, theta))[:, None, :]
    want = np.empty(x.shape)
    want[..., 0::2], want[..., 1::2] = z.real, z.imag
    np.testing.assert_allclose(rotary.rope(x, pos, 64, theta), want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("kwargs,error", [
    (dict(positions=np.array([0, -1])), ValueError),
    (dict(positions=np.array([0])), ValueError),            # one position for two rows
    (dict(n_rot=7), ValueError),
    (dict(n_rot=66), ValueError),
    (dict(base=np.ones(16)), ValueError),                    # 16 frequencies for 32 pairs
    (dict(base=0.0), ValueError),
    (dict(x=np.zeros((2, 64), np.float32)), ValueError),
    (dict(x=np.zeros((2, 1, 64), np.float64)), TypeError),
])
def test_rope_bad_input_is_a_clear_error(kwargs, error):
    args = dict(x=np.zeros((2, 1, 64), np.float32), positions=np.array([0, 1]), n_rot=64, base=10000.0)
    args.update(kwargs)
    with pytest.raises(error):
        rotary.rope(**args)


# -- silu_mul ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
def test_silu_mul_matches_twin(n):
    gate, up = rand((2, n), n, scale=4), rand((2, n), n + 1)
    np.testing.assert_allclose(ops.silu_mul(gate, up), ops.silu_mul_reference(gate, up), rtol=2e-6, atol=1e-7)


def test_silu_mul_extremes_and_in_place():
    gate = np.array([-1000, -90, -20, 0, 1e-6, 20, 90, 1000], np.float32)
    up = np.full_like(gate, 2.0)
    want = ops.silu_mul_reference(gate, up)
    got = ops.silu_mul(gate, up, out=gate)
    assert got is gate
    assert np.isfinite(gate).all()
    np.testing.assert_allclose(gate, want, rtol=2e-6, atol=1e-30)


# -- softmax -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES + [49152])
def test_softmax_matches_twin(n):
    x = rand((3, n), n, scale=8)
    got = ops.softmax(x)
    np.testing.assert_allclose(got, ops.softmax_reference(x), rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


def test_softmax_large_logits_and_masked_entries():
    x = np.array([[1e4, 1e4 - 1, -np.inf, 3e3], [-np.inf, 0.5, -np.inf, 0.5]], np.float32)
    got = ops.softmax(x, out=x)
    assert got is x
    np.testing.assert_allclose(x[0], [1 / (1 + np.e ** -1), 1 / (1 + np.e), 0, 0], rtol=1e-6)
    np.testing.assert_array_equal(x[1], [0, 0.5, 0, 0.5])


def test_facades_reject_bad_arrays():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(TypeError):
        ops.rms_norm(x.astype(np.float64), np.ones(8, np.float32), 1e-5)
    with pytest.raises(ValueError):
        ops.rms_norm(x, np.ones(7, np.float32), 1e-5)
    with pytest.raises(TypeError):
        ops.silu_mul(x[:, ::2], x[:, ::2])
    with pytest.raises(ValueError):
        ops.silu_mul(x, x[:1])
    with pytest.raises(ValueError):
        ops.softmax(x, out=np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError):
        ops.softmax(np.ones((), np.float32))


# -- the other families' glue: NEOX rope, gelu, biases, softcap, scale ------------------------------

def rope_neox_complex(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float) -> np.ndarray:
    """Independent formulation of NEOX: pair (x[i], x[i + n_rot/2]) as one complex number."""
    half = n_rot // 2
    freq = 1.0 / np.power(float(base), 2.0 * np.arange(half) / n_rot)
    rot = np.exp(1j * np.outer(np.asarray(positions, np.float64), freq))[:, None, :]
    z = (x[..., :half].astype(np.float64) + 1j * x[..., half:n_rot]) * rot
    y = x.astype(np.float64)
    y[..., :half], y[..., half:n_rot] = z.real, z.imag
    return y


@pytest.mark.parametrize("head_dim,n_rot", [(64, 64), (256, 256), (16, 16), (64, 32), (32, 12)])
def test_rope_neox_matches_complex_rotation_and_twin(head_dim, n_rot):
    x = rand((6, 3, head_dim), head_dim + 2 * n_rot)
    pos = np.array([0, 1, 2, 17, 511, 3000])
    got = rotary.rope(x, pos, n_rot, 1e6, neox=True)
    np.testing.assert_allclose(got, rope_neox_complex(x, pos, n_rot, 1e6), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(got, rotary.rope_reference(x, pos, n_rot, 1e6, neox=True),
                               rtol=1e-5, atol=2e-6)
    assert np.array_equal(got[..., n_rot:], x[..., n_rot:]) and np.array_equal(got[0], x[0])
    # the same rotation on other pairs: NEOX of x is NORM of x with its halves interleaved
    perm = np.ravel(np.stack([np.arange(n_rot // 2), np.arange(n_rot // 2, n_rot)], 1))
    perm = np.concatenate([perm, np.arange(n_rot, head_dim)])
    norm = rotary.rope(np.ascontiguousarray(x[..., perm]), pos, n_rot, 1e6)
    np.testing.assert_allclose(norm, got[..., perm], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", SIZES)
def test_gelu_mul_matches_twin(n):
    gate, up = rand(n, n, scale=4.0), rand(n, n + 1)
    got = ops.gelu_mul(gate, up)
    # the twin rounds as ggml's f16 table does; the kernel's f16 rounding keeps a few more bits
    # only for f16-subnormal inputs, and the last multiply may differ by one float32 ulp
    np.testing.assert_allclose(got, ops.gelu_mul_reference(gate, up), rtol=3e-7, atol=1e-7)


def test_gelu_mul_is_gelu_tanh_to_f16_precision_and_its_edges():
    g = np.concatenate([np.linspace(-12, 12, 4001, dtype=np.float32), [-10, 10, 0]]).astype(np.float32)
    got = ops.gelu_mul(g, np.ones_like(g))
    exact = ops.gelu_tanh_reference(g)
    np.testing.assert_allclose(got, exact, rtol=2e-3, atol=2e-4)  # f16 input and output
    assert (got[g <= -10] == 0).all() and np.array_equal(got[g >= 10], g[g >= 10])
    out = g.copy()
    ops.gelu_mul(out, np.ones_like(g), out=out)
    assert np.array_equal(out, got)


@pytest.mark.parametrize("n", SIZES)
def test_add_bias_is_exact(n):
    x, bias = rand((5, n), n), rand(n, n + 2)
    assert np.array_equal(ops.add_bias(x, bias), x + bias)
    ops.add_bias(x, bias, out=x)
    assert np.array_equal(x, rand((5, n), n) + bias)


@pytest.mark.parametrize("n", SIZES)
def test_add_matches_its_twin_exactly(n):
    x, y = rand((3, n), n), rand((3, n), n + 1)
    assert np.array_equal(ops.add(x, y), ops.add_reference(x, y))  # one rounding, both sides
    ops.add(x, y, out=x)
    assert np.array_equal(x, ops.add_reference(rand((3, n), n), y))
    with pytest.raises(ValueError, match="shape"):
        ops.add(x, y[:1])


@pytest.mark.parametrize("n", SIZES)
def test_softcap_and_scale_match_twins(n):
    x = rand(n, n, scale=30.0)
    np.testing.assert_allclose(ops.softcap(x, 12.0), ops.softcap_reference(x, 12.0), rtol=2e-6, atol=3e-6)
    assert np.abs(ops.softcap(x * 100, 12.0)).max() <= 12.0
    assert np.array_equal(ops.scale(x, 0.0625), x * np.float32(0.0625))
    with pytest.raises(ValueError):
        ops.softcap(x, 0.0)
