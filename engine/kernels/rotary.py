"""Rotary position embeddings: the frequency tables, the compiled rotation and its numpy twin.

    rope(x, positions, n_rot, base)  llama.cpp's "normal" mode (adjacent pairs) or, neox=True,
                                     its NEOX mode (halves); base is a theta, per-pair
                                     frequencies, or a RopeSpec (linear, LongRoPE, YaRN)

The rotation itself is IR in engine.kernels.ops (one module with the other glue kernels); the
cos/sin tables are built here once per (n_rot, frequencies) and grown as positions need. YaRN
lives wholly in the tables (its mixed angles, its magnitude on cos and sin), so the compiled
rotation is the same for every scaling.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.kernels.ir.builder import address
from engine.kernels.ops import check_f32, load_ops, out_like

_F32 = np.float32


def _logf(x: float | np.floating[Any]) -> np.float32:
    """glibc's logf (correctly rounded): the float64 log rounded once."""
    return _F32(np.log(np.float64(_F32(x))))


@dataclass(frozen=True)
class RopeSpec:
    """Rope angles computed the way llama.cpp computes them, so q and k match its bits.

    ggml builds each position's angles in float32: theta_0 = pos, theta_{i+1} = theta_i * s with
    s = powf(base, -2/n_rot); the angle of pair i is freq_scale * theta_i / freq_factors[i], and
    its cos/sin are correctly rounded (glibc's cosf/sinf). Exact float64 angles differ by a few
    float32 ulps at long positions, enough to flip later 8-bit roundings.

    YaRN (ext_factor != 0, ggml's rope_yarn): pair i's angle mixes the interpolated one
    (freq_scale * theta) and the extrapolated one (theta) by ramp(i) * ext_factor, the ramp
    falling from 1 to 0 over corr_dims (the pairs whose wavelength spans beta_fast .. beta_slow
    turns in n_ctx_orig positions), and cos/sin are scaled by magnitude(). With ext_factor 0
    the angles are computed exactly as before (attn_factor still scales cos/sin).
    """
    base: float
    freq_scale: float = 1.0
    freq_factors: tuple[float, ...] | None = None
    ext_factor: float = 0.0     # YaRN's mix; 0: plain (or linear) rope
    attn_factor: float = 1.0    # llama.cpp's cparams.yarn_attn_factor: cos/sin's factor
    n_ctx_orig: int = 0         # YaRN: the context the model was trained at (corr dims)
    beta_fast: float = 32.0     # YaRN: turns in n_ctx_orig where extrapolation ends...
    beta_slow: float = 1.0      # ...and where interpolation is whole

    def corr_dims(self, n_rot: int) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims: the first and last pair of the ramp, in float32."""
        def corr_dim(beta: float) -> np.float32:  # pair whose wavelength turns beta times
            turns = _F32(_F32(self.n_ctx_orig) / (_F32(_F32(beta) * _F32(2)) * _F32(np.pi)))
            return _F32(_F32(n_rot) * _logf(turns)) / _F32(_F32(2) * _logf(self.base))
        start = np.floor(corr_dim(self.beta_fast))
        end = np.ceil(corr_dim(self.beta_slow))
        return float(max(_F32(0), start)), float(min(_F32(n_rot - 1), end))

    def magnitude(self) -> np.float32:
        """cos/sin's float32 factor: attn_factor, times YaRN's 1 + 0.1 ln(1/freq_scale)."""
        mscale = _F32(self.attn_factor)
        if self.ext_factor != 0.0:
            mscale = mscale * (_F32(1) + _F32(0.1) * _logf(_F32(1) / _F32(self.freq_scale)))
        return _F32(mscale)

    def angles(self, positions: np.ndarray, n_rot: int) -> np.ndarray:
        """[M] positions -> float32 [M, n_rot/2] angles, in ggml's order of float32 operations."""
        f32 = _F32
        scale = f32(np.float64(f32(self.base)) ** np.float64(f32(-2.0) / f32(n_rot)))
        theta = np.asarray(positions).astype(f32)                   # [M]
        out = np.empty((theta.shape[0], n_rot // 2), dtype=f32)
        low, high = self.corr_dims(n_rot) if self.ext_factor != 0.0 else (0.0, 0.0)
        for i in range(n_rot // 2):
            t = theta / f32(self.freq_factors[i]) if self.freq_factors else theta
            out[:, i] = f32(self.freq_scale) * t
            if self.ext_factor != 0.0:  # rope_yarn: interp * (1 - mix) + extrap * mix
                y = (f32(i) - f32(low)) / max(f32(0.001), f32(high) - f32(low))
                mix = (f32(1) - min(f32(1), max(f32(0), y))) * f32(self.ext_factor)
                out[:, i] = out[:, i] * (f32(1) - mix) + t * mix
            theta = theta * scale
        return out


RopeFreqs = float | np.ndarray | RopeSpec  # a base (theta_i = base^(-2i/n_rot)), the [n_rot/2]
#                                            theta_i, or llama.cpp's float32 recipe


def rope_inv_freq(n_rot: int, base: float | np.ndarray) -> np.ndarray:
    """[n_rot/2] float64 per-pair angular speeds theta_i.

    A float is llama's base: theta_i = base^(-2i/n_rot). An array is taken as the theta_i
    themselves, for models that fold freq factors or linear scaling into them.
    """
    if isinstance(base, np.ndarray):
        if base.shape != (n_rot // 2,):
            raise ValueError(f"inverse frequencies must have shape ({n_rot // 2},), got {base.shape}")
        return base.astype(np.float64)
    if not base > 0:
        raise ValueError(f"rope base must be positive, got {base}")
    return float(base) ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)


def rope_magnitude(base: RopeFreqs) -> float:
    """The factor on cos and sin: a RopeSpec's magnitude(), else 1."""
    return float(base.magnitude()) if isinstance(base, RopeSpec) else 1.0


def rope_angles(positions: np.ndarray, n_rot: int, base: RopeFreqs) -> np.ndarray:
    """[M] positions -> [M, n_rot/2] float64 angles pos * theta_i (RopeSpec: ggml's float32)."""
    if isinstance(base, RopeSpec):
        return base.angles(positions, n_rot).astype(np.float64)
    return np.asarray(positions, dtype=np.float64)[:, None] * rope_inv_freq(n_rot, base)[None, :]


class _RopeTables:
    """cos/sin of pos * theta_i for pos < n_pos, i < n_rot/2, per (n_rot, base or theta_i).

    Built in float64 and rounded once, so they are as exact as float32 allows (a RopeSpec's
    magnitude then multiplies them in float32, as ggml's cosf(theta) * mscale). Tables only grow
    (doubling), and a reader never sees a half-built one: it is swapped in whole.
    """

    def __init__(self) -> None:
        self._tables: dict[tuple[int, object], tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def get(self, n_rot: int, base: RopeFreqs, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
        key = (n_rot, base.tobytes() if isinstance(base, np.ndarray)
               else base if isinstance(base, RopeSpec) else float(base))
        table = self._tables.get(key)
        if table is not None and table[0].shape[0] >= n_pos:
            return table
        with self._lock:
            table = self._tables.get(key)
            if table is None or table[0].shape[0] < n_pos:
                size = max(1024, 1 << (n_pos - 1).bit_length())
                angles = rope_angles(np.arange(size), n_rot, base)  # [size, n_rot/2]
                table = (np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32))
                if isinstance(base, RopeSpec) and base.magnitude() != 1:  # cosf(theta) * mscale
                    table = (table[0] * base.magnitude(), table[1] * base.magnitude())
                self._tables[key] = table
            return table


_rope_tables = _RopeTables()


def rope_tables(n_rot: int, base: RopeFreqs, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) float32 [>= n_pos, n_rot/2] as the rope kernel reads them (shared, read-only)."""
    return _rope_tables.get(n_rot, base, n_pos)

_MAX_POSITION = 1 << 24  # far beyond any context; guards the table against garbage positions


def rope(x: np.ndarray, positions: np.ndarray, n_rot: int, base: RopeFreqs,
         out: np.ndarray | None = None, neox: bool = False) -> np.ndarray:
    """Rotary embedding as llama.cpp applies it to llama-arch q/k (GGML_ROPE_TYPE_NORM).

    x: [M, n_heads, head_dim] float32, positions: [M] ints. Pairs (x[2i], x[2i+1]) for
    i < n_rot/2 turn by pos * theta_i, theta_i = base^(-2i/n_rot) (or given, see
    rope_inv_freq); dims >= n_rot are copied. Adjacent pairs, not NeoX halves, because
    convert_hf_to_gguf permutes the llama q/k weights to match. neox=True pairs
    (x[i], x[i + n_rot/2]) instead (GGML_ROPE_TYPE_NEOX: qwen2/3, phi3, gemma). out may be x.
    """
    check_f32(x, "x")
    if x.ndim != 3:
        raise ValueError(f"x must be [M, n_heads, head_dim], got shape {x.shape}")
    n_rows, n_heads, head_dim = x.shape
    if n_rot <= 0 or n_rot % 2 or n_rot > head_dim:
        raise ValueError(f"n_rot must be even and in (0, head_dim={head_dim}], got {n_rot}")
    pos = np.ascontiguousarray(positions, dtype=np.int64)
    if pos.shape != (n_rows,):
        raise ValueError(f"positions must have shape ({n_rows},), got {pos.shape}")
    out = out_like(out, x)
    if x.size == 0:
        return out
    fn = load_ops().rope_neox if neox else load_ops().rope
    cos, sin = _rope_tables.get(n_rot, base, 1)
    for attempt in range(2):  # a position past the table: check, grow the table, retry once
        if attempt:
            lo, hi = int(pos.min()), int(pos.max())
            if lo < 0 or hi >= _MAX_POSITION:
                raise ValueError(f"positions must be in [0, {_MAX_POSITION}), got {lo}..{hi}")
            cos, sin = _rope_tables.get(n_rot, base, hi + 1)
        bad = fn(address(x), address(out), address(pos), n_rows, n_heads, head_dim, n_rot // 2,
                 address(cos), address(sin), cos.shape[0])
        if bad == 0:
            return out
    raise AssertionError("unreachable: rope table was grown to cover every position")


def rope_reference(x: np.ndarray, positions: np.ndarray, n_rot: int, base: RopeFreqs,
                   neox: bool = False) -> np.ndarray:
    theta = rope_angles(np.asarray(positions), n_rot, base)[:, None, :]  # [M, 1, n_rot/2]
    magnitude = rope_magnitude(base)
    c, s = np.cos(theta) * magnitude, np.sin(theta) * magnitude
    x64 = x.astype(np.float64)
    y = x64.copy()
    half = n_rot // 2
    first, second = (np.s_[..., :half], np.s_[..., half:n_rot]) if neox else \
        (np.s_[..., 0:n_rot:2], np.s_[..., 1:n_rot:2])
    x0, x1 = x64[first], x64[second]
    y[first] = x0 * c - x1 * s
    y[second] = x0 * s + x1 * c
    return y.astype(np.float32)
