"""Hyperparameters of a model, read from GGUF metadata and checked.

The family (engine.arch) declares its keys and derives the rest (its spec's `keys` and
`finish`); this module walks that declaration for any family, then checks what every block
relies on. A key the engine cannot honour is refused here, at load, rather than ignored."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .arch import SPECS, ArchSpec
from .arch.declare import Key, KeyValue, KeyValues
from .gguf import ModelLoadError

SUPPORTED_ARCHS = tuple(SPECS)


@dataclass(frozen=True)
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int              # rotated dimensions per head (rope.dimension_count)
    rope_base: float
    rope_freq_scale: float  # 1 / linear rope scaling factor
    rms_eps: float
    window: int = 0               # sliding window of the local layers (0: none)
    swa_period: int = 0           # layer i is local when i % swa_period < swa_period - 1
    rope_base_swa: float = 0.0    # local layers' rope base
    attn_scale: float = 0.0       # q . k scale; 0: 1 / sqrt(head_dim)
    attn_softcap: float = 0.0     # 0: off
    final_softcap: float = 0.0    # 0: off
    embed_scale: float = 1.0      # the embedding row's factor (gemma: sqrt(n_embd) as float32)
    n_ctx_orig: int = 0           # rope.scaling.original_context_length (LongRoPE's switch)
    rope_freq_scale_swa: float = 1.0  # local layers' freq scale (gpt-oss: the full layers')
    yarn_ext_factor: float = 0.0  # YaRN's mix of extrapolated angles (0: plain rope)
    yarn_attn_factor: float = 1.0  # cos/sin's factor before ggml's YaRN mscale
    yarn_beta_fast: float = 32.0  # YaRN's ramp: the pairs turning beta_fast .. beta_slow
    yarn_beta_slow: float = 1.0   #   times in yarn_n_ctx_orig positions
    yarn_n_ctx_orig: int = 0      # the original context YaRN's ramp counts turns in
    extra: Mapping[str, KeyValue] = field(default_factory=dict)  # the family's own keys
    #                               (Key names that are not fields here), e.g. an expert count

    @property
    def spec(self) -> ArchSpec[Any]:
        return SPECS[self.arch]

    def layer_window(self, layer: int) -> int:
        """Keys a query of this layer sees (0: all before it)."""
        if self.window and self.swa_period and layer % self.swa_period < self.swa_period - 1:
            return self.window
        return 0

    def scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    def kv_bytes_per_token(self) -> int:
        """f16 keys + values over all layers for one cached token, windows aside (engine.kv
        sizes the cache, rings included)."""
        return 2 * 2 * self.n_layer * self.kv_dim

    @property
    def half_rot(self) -> int:
        return self.n_rot // 2

    def dim(self, name: str) -> int:
        """A declared tensor dim (engine.arch.declare) by name: a field, a property, or extra's."""
        value = getattr(self, name) if name in _DIMS else self.extra.get(name)
        if not isinstance(value, int):
            raise KeyError(f"{name} is not a hyperparameter of {self.arch}")
        return value

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], path: str) -> HParams:
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ModelLoadError(path, f"unsupported architecture {arch!r} "
                                       f"(supported: {', '.join(SUPPORTED_ARCHS)})")
        v = read_keys(meta, SPECS[arch].keys, KeyValues(arch, path))
        SPECS[arch].finish(v)
        vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        hp = cls(arch=arch, n_vocab=int(vocab), **{k: x for k, x in v.items() if k in _FIELDS},
                 extra={k: x for k, x in v.items() if k not in _FIELDS})
        for name in ("n_vocab", "n_embd", "n_layer", "head_dim", "n_ff"):
            if getattr(hp, name) <= 0:
                raise ModelLoadError(path, f"hyperparameter {name} = {getattr(hp, name)} must be > 0")
        if hp.head_dim % 8:
            raise ModelLoadError(path, f"head dim {hp.head_dim} is not a multiple of 8 (the "
                                       "attention kernel's vectors)")
        if hp.n_rot > hp.head_dim or hp.n_rot % 2:
            raise ModelLoadError(path, f"rope dimension count {hp.n_rot} does not fit head dim "
                                       f"{hp.head_dim}")
        return hp


_FIELDS = frozenset(f.name for f in dataclasses.fields(HParams)) - {"arch", "n_vocab", "extra"}
_DIMS = _FIELDS | {"n_vocab"} | {name for name, v in vars(HParams).items() if isinstance(v, property)}


def read_keys(meta: Mapping[str, Any], keys: tuple[Key, ...], v: KeyValues) -> KeyValues:
    """Each key's value into v (by Key.name), in order: the file's, else the default."""
    for key in keys:
        full = f"{v.arch}.{key.gguf}"
        value = meta.get(full)
        if value is None:
            value = key.default(v) if callable(key.default) else key.default
        if value is None:
            v.refuse(f"metadata key {full} is missing")
        if key.kind is tuple:  # an array the family reads per layer
            if not isinstance(value, list | tuple) or not all(isinstance(x, int) for x in value):
                v.refuse(f"{full} = {value!r} is not an array of integers")
            v[key.name] = tuple(int(x) for x in value)
            continue
        if isinstance(value, list):  # per-layer arrays: one value for all layers, as llama's
            if not value or any(x != value[0] for x in value):
                v.refuse(f"{full}: per-layer values are not supported")
            value = value[0]
        try:
            v[key.name] = key.kind(value)  # type: ignore[arg-type]  # a scalar kind here
        except (TypeError, ValueError):
            v.refuse(f"{full} = {value!r} is not a {key.kind.__name__}")
    return v
