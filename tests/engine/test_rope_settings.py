"""A load's rope settings over the file's (engine/rope_settings.py) against llama.cpp: the logits
llama-cpp-python gave with the same context parameters on the synth files (tests/data/rope,
made by scripts/make_rope_refs.py), within the synth manifest's tolerances; and the rules of
llama-context.cpp that decide which value wins, each on its own."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import engine
from engine.model import Chunk
from engine.rope_settings import RopeSettings, RopeTrain, context_rope
from tests.support.llama_cpp_checks import assert_within
from tests.support.refs import SYNTH_DIR

REFS = np.load(SYNTH_DIR.parent / "rope" / "rope_refs.npz")
CASES = sorted(k[:-len("_logits")] for k in REFS.files if k.endswith("_logits"))
TOLERANCE = {e["file"]: e["suggested_tolerance"]
             for e in json.loads((SYNTH_DIR / "manifest.json").read_text())["models"]}
LLAMA_SCALING = {-1: None, 0: "none", 1: "linear", 2: "yarn"}  # enum llama_rope_scaling_type


def _settings(case: str) -> tuple[str, RopeSettings]:
    given: dict[str, Any] = json.loads(str(REFS[f"{case}_settings"]))
    file = given.pop("file")
    given["rope_scaling_type"] = LLAMA_SCALING[given["rope_scaling_type"]]
    return file, RopeSettings(**given)


def _logits(file: str, rope: RopeSettings | None) -> np.ndarray:
    ids = np.load(SYNTH_DIR / file.replace(".gguf", ".npz"))["ids"].tolist()
    with engine.load(SYNTH_DIR / file, n_ctx=128, n_threads=2, flash_attn=False,
                     rope=rope) as model:
        return model.transformer.forward([Chunk(0, ids, 0)], "all")[0]  # [40, n_vocab]


def test_the_references_cover_each_key() -> None:
    set_keys = {k for case in CASES for k, v in vars(_settings(case)[1]).items()
                if v != getattr(RopeSettings(), k)}
    assert set_keys == set(vars(RopeSettings()))


@pytest.mark.parametrize("case", CASES)
def test_logits_match_llama_cpp_under_the_same_rope_settings(case: str) -> None:
    file, rope = _settings(case)
    ours = _logits(file, rope)
    assert_within(ours, REFS[f"{case}_logits"], TOLERANCE[file], case)


def test_the_overrides_move_the_logits_and_none_leaves_them() -> None:
    """Against the file's own logits (llama.cpp's, tests/data/synth): each case but the one
    that scales under type none moves them far beyond the tolerance, as llama.cpp's did."""
    for case in CASES:
        file, _ = _settings(case)
        plain = np.load(SYNTH_DIR / file.replace(".gguf", ".npz"))["logits"]
        moved = float(np.abs(REFS[f"{case}_logits"] - plain).max())
        assert (moved == 0.0) == (case == "qwen2_none_ignores_scale"), case
        if moved:
            assert moved > 10 * TOLERANCE[file]["max_abs"], case


TRAIN = RopeTrain(freq_base=10000.0, scaling="linear", freq_scale=0.5, attn_factor=1.0,
                  yarn_ext_factor=-1.0, yarn_attn_factor=1.0, yarn_beta_fast=32.0,
                  yarn_beta_slow=1.0, n_ctx_orig=4096)


def test_nothing_set_keeps_the_file() -> None:
    c = context_rope(TRAIN)
    assert (c.rope_base, c.rope_freq_scale, c.yarn_ext_factor, c.yarn_attn_factor) == (
        10000.0, 0.5, 0.0, 1.0)
    assert (c.yarn_beta_fast, c.yarn_beta_slow, c.yarn_n_ctx_orig) == (32.0, 1.0, 4096)


def test_each_setting_wins_over_the_file() -> None:
    c = context_rope(TRAIN, RopeSettings(rope_freq_base=500.0, rope_freq_scale=0.125,
                                         yarn_beta_fast=8.0, yarn_beta_slow=2.0,
                                         yarn_orig_ctx=64))
    assert (c.rope_base, c.rope_freq_scale) == (500.0, 0.125)
    assert (c.yarn_beta_fast, c.yarn_beta_slow, c.yarn_n_ctx_orig) == (8.0, 2.0, 64)


def test_the_scaling_type_decides_scale_and_mix() -> None:
    none = context_rope(TRAIN, RopeSettings(rope_scaling_type="none", rope_freq_scale=0.25))
    assert none.rope_freq_scale == 1.0  # "never scale if scaling type is none"
    yarn = context_rope(TRAIN, RopeSettings(rope_scaling_type="yarn"))
    assert (yarn.rope_freq_scale, yarn.yarn_ext_factor) == (0.5, 1.0)
    # YaRN's attn factor: llama.cpp's mscale over the 1 + 0.1 ln 2 ggml multiplies back, f32
    f32 = np.float32
    log2 = f32(np.log(np.float64(2.0)))
    mscale = f32(0.1) * log2 + f32(1)
    assert yarn.yarn_attn_factor == float(mscale * (f32(1) / (f32(1) + f32(0.1) * log2)))
    mixed = context_rope(TRAIN, RopeSettings(rope_scaling_type="yarn", yarn_ext_factor=0.25))
    assert mixed.yarn_ext_factor == 0.25


def test_the_attn_factor_is_read_only_without_yarn_mixing() -> None:
    assert context_rope(TRAIN, RopeSettings(yarn_attn_factor=0.8)).yarn_attn_factor == (
        float(np.float32(0.8)))
    yarn = context_rope(TRAIN, RopeSettings(rope_scaling_type="yarn", yarn_attn_factor=0.8))
    assert yarn.yarn_attn_factor == pytest.approx(1.0, abs=1e-6)  # replaced by YaRN's own
    scaled = RopeTrain(**{**vars(TRAIN), "attn_factor": 2.0})  # rope.scaling.attn_factor
    assert context_rope(scaled, RopeSettings(yarn_attn_factor=0.8)).yarn_attn_factor == (
        float(np.float32(0.8) * np.float32(2.0)))


@pytest.mark.parametrize("bad", [
    {"rope_scaling_type": "longrope"}, {"rope_freq_base": -1.0}, {"rope_freq_scale": -0.5},
    {"yarn_orig_ctx": -1}, {"yarn_ext_factor": float("nan")}, {"yarn_beta_fast": float("inf")},
])
def test_bad_settings_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RopeSettings(**bad)


def test_windowed_layers_keep_the_files_base() -> None:
    """gemma3's local layers rope with their own base (rope.freq_base_swa); a base override
    is the global layers' only, as llama.cpp's rope_freq_base_train_swa stays."""
    path = SYNTH_DIR / "gemma3_d64_l6_swa8_f32.gguf"
    with engine.load(path, n_ctx=32, n_threads=1, rope=RopeSettings(rope_freq_base=1e5)) as m:
        hp = m.hparams
        bases = {hp.layer_window(i) > 0: r.base for i, r in enumerate(m.transformer.ropes)}
    assert bases == {True: 10000.0, False: 1e5}
