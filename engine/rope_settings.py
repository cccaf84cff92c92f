"""A load's rope settings over the file's own: llama-context.cpp's cparams for rope, once.

llama.cpp reads a file's rope facts (llama-model.cpp: hparams) and lets a context override
them (llama_context_params: rope_freq_base, rope_freq_scale, rope_scaling_type, yarn_*), each
with a "not set" value that keeps the file's. `context_rope(train, settings)` is that derivation,
in float32 as llama.cpp computes it. engine.arch.llama's finish applies it with nothing set (the
file as it is); HParams.with_rope with a load's settings (a config entry's rope keys).

    RopeTrain     the file's: freq base, scaling type (llama.cpp reads an absent key as
                  "linear"), 1 / rope.scaling.factor, rope.scaling.attn_factor, the yarn keys
    RopeSettings  a load's overrides; each default is llama.cpp's "not set"
    ContextRope   what the forward ropes with (HParams' fields of the same names)

Windowed (SWA) layers keep the file's base and scale, as llama.cpp's rope_freq_base_train_swa;
every layer takes the context's YaRN values.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCALING_TYPES = ("none", "linear", "yarn")
_F32 = np.float32


@dataclass(frozen=True)
class RopeTrain:
    """The file's rope facts, as llama-model.cpp reads them."""
    freq_base: float
    scaling: str             # rope.scaling.type; "linear" when the file has none
    freq_scale: float        # 1 / rope.scaling.factor (1 when absent or 0), whatever the type
    attn_factor: float       # rope.scaling.attn_factor (1 when absent)
    yarn_ext_factor: float   # the file's rope.scaling.yarn_* (< 0: not set)
    yarn_attn_factor: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    n_ctx_orig: int          # rope.scaling.original_context_length, else the trained context


@dataclass(frozen=True)
class RopeSettings:
    """A load's overrides, named as llama-cpp-python's keys; the defaults keep the file's."""
    rope_freq_base: float = 0.0           # 0: the file's
    rope_freq_scale: float = 0.0          # 0: the file's (1 / factor); 0.25 = 4x linear
    rope_scaling_type: str | None = None  # none | linear | yarn; None: the file's
    yarn_ext_factor: float = -1.0         # < 0: 1 under yarn, else 0
    yarn_attn_factor: float = -1.0        # < 0: the file's (only read when ext_factor is 0)
    yarn_beta_fast: float = -1.0          # < 0: the file's (32 unless it says)
    yarn_beta_slow: float = -1.0          # < 0: the file's (1 unless it says)
    yarn_orig_ctx: int = 0                # 0: the file's original context, else trained

    def __post_init__(self) -> None:
        if self.rope_scaling_type not in (None, *SCALING_TYPES):
            raise ValueError(f"rope_scaling_type {self.rope_scaling_type!r} is not one of "
                             f"{', '.join(SCALING_TYPES)}")
        for name in ("rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor",
                     "yarn_beta_fast", "yarn_beta_slow"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number")
        if self.rope_freq_base < 0 or self.rope_freq_scale < 0 or self.yarn_orig_ctx < 0:
            raise ValueError("rope_freq_base, rope_freq_scale and yarn_orig_ctx must be >= 0 "
                             "(0: the file's)")


@dataclass(frozen=True)
class ContextRope:
    """llama.cpp's cparams for rope (HParams' fields of these names)."""
    rope_base: float
    rope_freq_scale: float
    yarn_ext_factor: float
    yarn_attn_factor: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    yarn_n_ctx_orig: int


def context_rope(train: RopeTrain, s: RopeSettings = RopeSettings()) -> ContextRope:
    """llama_context's constructor on rope: a setting that is set wins, then the scaling type
    decides the scale (none: 1) and ext_factor (yarn: 1, else 0), and YaRN replaces attn_factor
    by its mscale divided by the 1 + 0.1 ln(factor) ggml multiplies back; the file's
    rope.scaling.attn_factor multiplies last."""
    scaling = s.rope_scaling_type if s.rope_scaling_type is not None else train.scaling
    freq_scale = _F32(s.rope_freq_scale if s.rope_freq_scale != 0 else train.freq_scale)
    if scaling == "none":
        freq_scale = _F32(1)  # "never scale if scaling type is none"
    ext = s.yarn_ext_factor if s.yarn_ext_factor >= 0 else train.yarn_ext_factor
    if ext < 0:
        ext = 1.0 if scaling == "yarn" else 0.0
    attn = _F32(s.yarn_attn_factor if s.yarn_attn_factor >= 0 else train.yarn_attn_factor)
    if ext != 0:
        attn = _yarn_attn_factor(_F32(1) / freq_scale)
    return ContextRope(
        rope_base=float(_F32(s.rope_freq_base if s.rope_freq_base != 0 else train.freq_base)),
        rope_freq_scale=float(freq_scale),
        yarn_ext_factor=float(_F32(ext)),
        yarn_attn_factor=float(attn * _F32(train.attn_factor)),
        yarn_beta_fast=float(_F32(s.yarn_beta_fast if s.yarn_beta_fast >= 0
                                  else train.yarn_beta_fast)),
        yarn_beta_slow=float(_F32(s.yarn_beta_slow if s.yarn_beta_slow >= 0
                                  else train.yarn_beta_slow)),
        yarn_n_ctx_orig=s.yarn_orig_ctx or train.n_ctx_orig)


def _yarn_attn_factor(factor: np.float32) -> np.float32:
    """cparams.yarn_attn_factor under YaRN, in float32: get_mscale(factor, 1) times
    1 / (1 + 0.1 ln factor), which the roundings leave a few ulps from 1 (ggml then multiplies
    by 1 + 0.1 ln factor itself). glibc's logf is correctly rounded: the float64 log, rounded."""
    log = _F32(np.log(np.float64(factor)))
    mscale = _F32(1) if factor <= 1 else _F32(0.1) * log + _F32(1)
    return _F32(mscale * (_F32(1) / (_F32(1) + _F32(0.1) * log)))
