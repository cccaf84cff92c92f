"""The Gated DeltaNet's pieces (engine/kernels/delta_net.py) against float64 transcriptions of
llama.cpp's ops: the causal conv (ggml_ssm_conv), and the delta rule as
build_delta_net_autoregressive writes it, which both the recurrent and the chunked form must
give, outputs and final state, whatever the chunk size and wherever a sequence is split."""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import delta_net as dn


def _rule_float64(q, k, v, g, beta, state):
    """One head at a time, token by token, in float64: s *= exp(g); d = (v - s k) * beta;
    s += d k^T; o = s q (s [S_v, S_k])."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    s = np.array(state, np.float64)
    n, H, S_v = v.shape
    o = np.zeros((n, H, S_v))
    for h in range(H):
        for t in range(n):
            s[h] *= np.exp(g[t, h])
            d = (v[t, h] - s[h] @ k[t, h]) * beta[t, h]
            s[h] += np.outer(d, k[t, h])
            o[t, h] = s[h] @ q[t, h]
    return o, s


def _inputs(n: int, H: int = 3, S: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    f = np.float32
    k = dn.l2_norm(rng.standard_normal((n, H, S)).astype(f), 1e-6)
    q = dn.l2_norm(rng.standard_normal((n, H, S)).astype(f), 1e-6) / f(np.sqrt(S))
    v = rng.standard_normal((n, H, S)).astype(f)
    g = -rng.uniform(0.01, 1.5, (n, H)).astype(f)       # decays exp(g) in (0.22, 0.99)
    beta = rng.uniform(0.05, 1.0, (n, H)).astype(f)
    state = (0.3 * rng.standard_normal((H, S, S))).astype(f)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("form", [dn.recurrent, dn.recurrent_reference])
@pytest.mark.parametrize("n, S", [(1, 8), (5, 8), (64, 8), (150, 8), (9, 21)])
def test_the_recurrent_form_is_the_rule(form, n: int, S: int) -> None:
    """The compiled kernel and its numpy twin (S 21: the kernel's vector steps and scalar tail)."""
    q, k, v, g, beta, state = _inputs(n, S=S)
    want_o, want_s = _rule_float64(q, k, v, g, beta, state)
    s = state[None].copy()
    o = form(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], s)[:, 0]
    np.testing.assert_allclose(o, want_o, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(s[0], want_s, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("n, chunk", [(1, 64), (7, 64), (64, 64), (150, 64), (150, 16), (33, 1)])
def test_the_chunked_form_is_the_rule(n: int, chunk: int) -> None:
    q, k, v, g, beta, state = _inputs(n, seed=n)
    want_o, want_s = _rule_float64(q, k, v, g, beta, state)
    s = state.copy()
    o = dn.chunked(q, k, v, g, beta, s, chunk=chunk)
    np.testing.assert_allclose(o, want_o, atol=5e-5, rtol=1e-4)
    np.testing.assert_allclose(s, want_s, atol=5e-5, rtol=1e-4)


def test_several_sequences_side_by_side_are_each_their_own_rule() -> None:
    """The decode path: B sequences' states gathered, one token each, computed together."""
    seqs = [_inputs(1, seed=s) for s in range(4)]
    stacked = [np.stack([x[i] for x in seqs], axis=1) for i in range(5)]  # [1, B, ...]
    states = np.stack([x[5] for x in seqs])                                # [B, H, S, S]
    twin_states = states.copy()
    twin = dn.recurrent_reference(*stacked, twin_states)[0]
    o = dn.recurrent(*stacked, states)[0]
    np.testing.assert_allclose(o, twin, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(states, twin_states, atol=1e-5, rtol=1e-5)
    for b, (q, k, v, g, beta, state) in enumerate(seqs):
        want_o, want_s = _rule_float64(q, k, v, g, beta, state)
        np.testing.assert_allclose(o[b], want_o[0], atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(states[b], want_s, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("form", [dn.conv_silu, dn.conv_silu_reference])
@pytest.mark.parametrize("B, n, C, d", [(1, 11, 6, 4), (1, 2, 19, 4), (3, 1, 16, 4), (2, 5, 9, 2)])
def test_the_causal_conv_is_ggml_ssm_conv_and_its_state_carries_on(form, B, n, C, d) -> None:
    """silu(ggml_ssm_conv) in float64 over [state; x]; then the same rows in two calls, the
    second from the state the first left, give the same outputs and the same final state."""
    rng = np.random.default_rng(n * C)
    x = rng.standard_normal((B, n, C)).astype(np.float32)
    kernel = rng.standard_normal((C, d)).astype(np.float32)     # the file's layout
    state = rng.standard_normal((B, d - 1, C)).astype(np.float32)
    xin = np.concatenate([state, x], axis=1).astype(np.float64)
    conv = np.array([[[sum(xin[s, t + i, c] * kernel[c, i] for i in range(d)) for c in range(C)]
                      for t in range(n)] for s in range(B)])
    kernel_t = np.ascontiguousarray(kernel.T)
    s1 = state.copy()
    out = form(x, s1, kernel_t)
    np.testing.assert_allclose(out, conv / (1 + np.exp(-conv)), atol=1e-5)
    np.testing.assert_array_equal(s1, xin[:, n:].astype(np.float32))
    s2, cut = state.copy(), max(1, n // 2)
    first = form(x[:, :cut], s2, kernel_t)
    second = form(x[:, cut:], s2, kernel_t) if cut < n else np.empty((B, 0, C), np.float32)
    np.testing.assert_allclose(np.concatenate([first, second], axis=1), out, atol=1e-6)
    np.testing.assert_array_equal(s2, s1)


def test_the_gates_are_ggmls() -> None:
    x = np.array([-30.0, -1.0, 0.0, 2.5, 19.0, 21.0, 80.0], np.float32)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(dn.softplus(x), np.where(x64 > 20, x64, np.log1p(np.exp(x64))),
                               rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(dn.sigmoid(x), 1 / (1 + np.exp(-x64)), rtol=1e-6, atol=1e-30)
    v = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    np.testing.assert_allclose(dn.l2_norm(v, 1e-6), [[0.6, 0.8], [0.0, 0.0]], atol=1e-6)


def test_the_heads_split_between_threads_give_the_same_bits(monkeypatch) -> None:
    monkeypatch.setattr(dn, "SPLIT_WORK", 1)              # split even this small call
    q, k, v, g, beta, state = _inputs(12, H=5)
    one, two = state[None].copy(), state[None].copy()
    args = (q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None])
    np.testing.assert_array_equal(dn.recurrent(*args, one), dn.recurrent(*args, two, threads=2))
    np.testing.assert_array_equal(one, two)
