"""YaRN rope as llama.cpp computes it: the compiled rope against its numpy twin, the twin
against a float64 transcription of ggml's C (ggml.c ggml_rope_yarn_corr_dims, ggml-cpu ops.cpp
rope_yarn_ramp / rope_yarn), the keys as llama-model.cpp and llama-context.cpp derive them, and
a tiny file whose yarn keys change its logits while the fused graph keeps the eager twin's bits.
gpt-oss's settings throughout: factor 32, original context 4096, beta_fast 32, beta_slow 1."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.gguf import read_header
from engine.hparams import HParams
from engine.kernels import rotary
from engine.model import Chunk
from tests.support.ggufgen import write_tiny_llama
from tests.support.refs import SYNTH3_DIR

FACTOR, ORIG_CTX = 32.0, 4096
GPTOSS = SYNTH3_DIR / "gptoss_d64_e8k2_swa8_sinks_f32.gguf"


def yarn_spec(base: float = 150000.0, ext_factor: float = 1.0) -> rotary.RopeSpec:
    return rotary.RopeSpec(base, 1.0 / FACTOR, ext_factor=ext_factor, n_ctx_orig=ORIG_CTX,
                           beta_fast=32.0, beta_slow=1.0)


# -- ggml's formulas, transcribed from the C source in float64 ------------------------------------

def ggml_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    def corr_dim(n_rot: float) -> float:  # ggml_rope_yarn_corr_dim
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    start, end = math.floor(corr_dim(beta_fast)), math.ceil(corr_dim(beta_slow))
    return max(0.0, start), min(n_dims - 1.0, end)


def ggml_rope_yarn(pos: int, n_dims: int, base: float, freq_scale: float, ext_factor: float,
                   attn_factor: float, corr: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """rope_cache_init + rope_yarn for one position: [n_dims/2] cos, sin (times mscale)."""
    cos, sin = np.empty(n_dims // 2), np.empty(n_dims // 2)
    theta_scale = base ** (-2.0 / n_dims)
    for i0 in range(0, n_dims, 2):
        theta_extrap = pos * theta_scale ** (i0 // 2)
        theta_interp = freq_scale * theta_extrap
        theta, mscale = theta_interp, attn_factor
        if ext_factor != 0.0:
            y = (i0 // 2 - corr[0]) / max(0.001, corr[1] - corr[0])  # rope_yarn_ramp
            ramp_mix = (1 - min(1.0, max(0.0, y))) * ext_factor
            theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
            mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
        cos[i0 // 2], sin[i0 // 2] = math.cos(theta) * mscale, math.sin(theta) * mscale
    return cos, sin


@pytest.mark.parametrize("n_rot,base", [(64, 150000.0), (16, 10000.0), (128, 500000.0)])
def test_the_twin_is_ggml_yarn_in_float64(n_rot: int, base: float) -> None:
    spec = yarn_spec(base)
    corr = ggml_corr_dims(n_rot, ORIG_CTX, base, 32.0, 1.0)
    assert spec.corr_dims(n_rot) == corr
    assert 0 < corr[0] < corr[1] < n_rot // 2  # the ramp is inside: both ends are exercised
    positions = np.array([0, 1, 7, 100, 1000, 4095, 20000])
    cos, sin = rotary.rope_tables(n_rot, spec, int(positions.max()) + 1)
    for pos in positions:
        want_cos, want_sin = ggml_rope_yarn(int(pos), n_rot, base, 1.0 / FACTOR, 1.0, 1.0, corr)
        # float32 angles carry ~pos * 1e-7 rad of rounding (ggml's own float32 does too)
        tol = 2e-6 * max(1, int(pos))
        np.testing.assert_allclose(cos[pos], want_cos, atol=tol)
        np.testing.assert_allclose(sin[pos], want_sin, atol=tol)
    # pair 0 is extrapolated (plain rope's angle), the last interpolated (angle / factor)
    angles = spec.angles(np.array([100]), n_rot)[0]
    plain = rotary.rope_angles(np.array([100]), n_rot, base)[0]
    assert angles[0] == pytest.approx(plain[0], rel=1e-6)
    assert angles[-1] == pytest.approx(plain[-1] / FACTOR, rel=1e-5)
    assert spec.magnitude() == pytest.approx(1 + 0.1 * math.log(FACTOR), rel=1e-6)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("head_dim,n_rot", [(64, 64), (64, 32), (128, 128)])
def test_the_kernel_matches_the_twin_at_many_positions(head_dim: int, n_rot: int, neox: bool) -> None:
    rng = np.random.default_rng(n_rot + neox)
    pos = np.concatenate([np.arange(40), rng.integers(40, 70000, 40)])
    x = rng.standard_normal((len(pos), 3, head_dim)).astype(np.float32)
    spec = yarn_spec()
    got = rotary.rope(x, pos, n_rot, spec, neox=neox)
    np.testing.assert_allclose(got, rotary.rope_reference(x, pos, n_rot, spec, neox=neox),
                               rtol=1e-5, atol=4e-6)
    plain = rotary.rope(x, pos, n_rot, rotary.RopeSpec(150000.0, 1.0 / FACTOR), neox=neox)
    assert np.abs(got - plain).max() > 0.1  # the mix and the magnitude both move the rows


def test_the_attn_factor_scales_cos_and_sin_without_yarn() -> None:
    x = np.random.default_rng(1).standard_normal((5, 2, 32)).astype(np.float32)
    pos = np.arange(5)
    plain = rotary.rope(x, pos, 32, rotary.RopeSpec(10000.0))
    scaled = rotary.rope(x, pos, 32, rotary.RopeSpec(10000.0, attn_factor=1.25))
    np.testing.assert_allclose(scaled, plain * 1.25, rtol=1e-6, atol=1e-6)


# -- the keys -------------------------------------------------------------------------------------

def gptoss_meta(**keys: object) -> dict:
    meta = dict(read_header(GPTOSS)[0])
    meta.update({f"gpt-oss.rope.scaling.{k}": v for k, v in keys.items()})
    return meta


def test_gpt_oss_yarn_keys_become_llama_cpp_s_cparams() -> None:
    hp = HParams.from_metadata(gptoss_meta(type="yarn", factor=FACTOR,
                                           original_context_length=ORIG_CTX), "x")
    assert hp.rope_freq_scale == hp.rope_freq_scale_swa == 1.0 / FACTOR  # windowed layers too
    assert (hp.yarn_ext_factor, hp.yarn_n_ctx_orig) == (1.0, ORIG_CTX)
    assert (hp.yarn_beta_fast, hp.yarn_beta_slow) == (32.0, 1.0)
    # llama.cpp cancels ggml's mscale in float32: a few ulps from 1, not exactly 1
    assert hp.yarn_attn_factor == pytest.approx(1.0, abs=1e-6)
    plain = HParams.from_metadata(gptoss_meta(), "x")
    assert (plain.yarn_ext_factor, plain.yarn_attn_factor, plain.rope_freq_scale) == (0.0, 1.0, 1.0)
    assert plain.yarn_n_ctx_orig == plain.n_ctx_train  # n_ctx_orig_yarn's default


def test_explicit_yarn_keys_win_and_the_attn_factor_multiplies() -> None:
    hp = HParams.from_metadata(gptoss_meta(type="yarn", factor=4.0, yarn_ext_factor=0.5,
                                           yarn_beta_fast=16.0, yarn_beta_slow=2.0,
                                           attn_factor=1.5), "x")
    assert (hp.yarn_ext_factor, hp.yarn_beta_fast, hp.yarn_beta_slow) == (0.5, 16.0, 2.0)
    assert hp.yarn_attn_factor == pytest.approx(1.5, rel=1e-6)
    off = HParams.from_metadata(gptoss_meta(type="yarn", factor=4.0, yarn_ext_factor=0.0,
                                            yarn_attn_factor=0.75), "x")
    assert (off.yarn_ext_factor, off.yarn_attn_factor) == (0.0, 0.75)  # only then is it read
    linear = HParams.from_metadata(gptoss_meta(type="linear", factor=4.0), "x")
    assert (linear.rope_freq_scale, linear.yarn_ext_factor) == (0.25, 0.0)


# -- a tiny file ----------------------------------------------------------------------------------

YARN_KEYS = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": FACTOR,
             "llama.rope.scaling.original_context_length": ORIG_CTX}


def _logits(path: Path, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    with engine.load(path, n_ctx=128, n_threads=2, n_slots=2, flash_attn=False) as model:
        tr = model.transformer
        fused = tr.forward([Chunk(0, ids, 0)], "all")[0]
        eager = tr.forward_eager([Chunk(1, ids, 0)], "all")[0]
    return fused, eager


def test_a_yarn_file_loads_fused_equals_eager_and_the_keys_bite(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType
    kw = dict(qtype=GGMLQuantizationType.F32, n_ctx_train=8192, seed=3)
    yarn = write_tiny_llama(tmp_path / "yarn.gguf", metadata=YARN_KEYS, **kw)
    plain = write_tiny_llama(tmp_path / "plain.gguf", **kw)
    ids = list(range(3, 60))
    fused, eager = _logits(yarn, ids)
    np.testing.assert_array_equal(fused, eager)
    without, _ = _logits(plain, ids)
    moved = np.abs(fused - without).max(axis=-1)            # [T]
    assert moved[0] == pytest.approx(0.0, abs=1e-6)         # row 0 attends to itself alone
    assert moved[1:].min() > 1e-3                           # every later row moves
