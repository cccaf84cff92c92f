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
from .kv_types import F16, KVType
from .rope_settings import RopeSettings, RopeTrain, context_rope

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
    swa_pattern: tuple[bool, ...] = ()  # per layer: sliding-window (a file's own pattern,
    #                               gemma4; () : swa_period decides)
    head_dim_swa: int = 0         # the sliding-window layers' head dim (0: head_dim; gemma4)
    n_rot_swa: int = 0            # their rotated dims (0: n_rot)
    kv_from: tuple[int, ...] = () # per layer: the layer whose KV cache it reads, itself when it
    #                               has its own (gemma4's shared KV; () : every layer its own)
    n_ff_layers: tuple[int, ...] = ()       # per layer when they differ (n_ff is the widest;
    n_head_kv_layers: tuple[int, ...] = ()  # n_head_kv the most): a file's per-layer arrays
    rope_train: RopeTrain | None = None  # the file's rope facts the fields above came from
    extra: Mapping[str, KeyValue] = field(default_factory=dict)  # the family's own keys
    #                               (Key names that are not fields here), e.g. an expert count

    @property
    def spec(self) -> ArchSpec[Any]:
        return SPECS[self.arch]

    def is_swa(self, layer: int) -> bool:
        """A sliding-window layer by the file's pattern (its window aside: a window of 0 keeps
        the layer's own head dim and rope)."""
        if self.swa_pattern:
            return self.swa_pattern[layer]
        return bool(self.swa_period) and layer % self.swa_period < self.swa_period - 1

    def with_rope(self, settings: RopeSettings) -> HParams:
        """These hyperparameters with a load's rope settings over the file's (llama.cpp's
        context parameters); windowed layers keep the file's base, as llama.cpp's do."""
        if self.rope_train is None or settings == RopeSettings():
            return self
        return dataclasses.replace(self, **vars(context_rope(self.rope_train, settings)),
                                   rope_base_swa=self.rope_base_swa or self.rope_base)

    def layer_window(self, layer: int) -> int:
        """Keys a query of this layer sees (0: all before it)."""
        return self.window if self.window and self.is_swa(layer) else 0

    def layer_n_ff(self, layer: int) -> int:
        return self.n_ff_layers[layer] if self.n_ff_layers else self.n_ff

    def layer_n_head_kv(self, layer: int) -> int:
        return self.n_head_kv_layers[layer] if self.n_head_kv_layers else self.n_head_kv

    def layer_head_dim(self, layer: int) -> int:
        return self.head_dim_swa if self.head_dim_swa and self.is_swa(layer) else self.head_dim

    def layer_n_rot(self, layer: int) -> int:
        return self.n_rot_swa if self.n_rot_swa and self.is_swa(layer) else self.n_rot

    def kv_layer(self, layer: int) -> int:
        """The layer whose KV cache this one reads (itself unless it shares an earlier one's)."""
        return self.kv_from[layer] if self.kv_from else layer

    def has_kv(self, layer: int) -> bool:
        """The layer computes and stores its own keys and values."""
        return self.kv_layer(layer) == layer

    def layer_dims(self, layer: int) -> dict[str, int]:
        """The per-layer dims a declared tensor may name (engine.arch.declare), as this layer
        has them: they differ from the model's between sliding and full layers (gemma4)."""
        hd, n_kv = self.layer_head_dim(layer), self.layer_n_head_kv(layer)
        return {"head_dim": hd, "q_dim": self.n_head * hd, "kv_dim": n_kv * hd, "n_head_kv": n_kv,
                "half_rot": self.layer_n_rot(layer) // 2, "n_ff": self.layer_n_ff(layer)}

    def scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    def kv_bytes_per_token(self, type_k: KVType = F16, type_v: KVType = F16) -> int:
        """Keys + values over the layers that keep their own, for one cached token, windows
        aside (engine.kv sizes the cache, rings included); f16 unless typed (engine.kv_types)."""
        dims = [self.layer_dims(li) for li in range(self.n_layer) if self.has_kv(li)]
        return sum(d["n_head_kv"] * (type_k.row_bytes(d["head_dim"]) + type_v.row_bytes(d["head_dim"]))
                   for d in dims)

    @property
    def half_rot(self) -> int:
        return self.n_rot // 2

    def dim(self, name: str, layer: int | None = None) -> int:
        """A declared tensor dim (engine.arch.declare) by name: a field, a property, or extra's;
        of one layer when given (layer_dims: a sliding layer's head dim may differ)."""
        if layer is not None and name in (dims := self.layer_dims(layer)):
            return dims[name]
        if name.isdigit():  # a literal size (gemma4's one-float layer_output_scale)
            return int(name)
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
        for li in range(hp.n_layer):
            head_dim, n_rot = hp.layer_head_dim(li), hp.layer_n_rot(li)
            if head_dim % 8:
                raise ModelLoadError(path, f"head dim {head_dim} is not a multiple of 8 (the "
                                           "attention kernel's vectors)")
            if n_rot > head_dim or n_rot % 2:
                raise ModelLoadError(path, f"rope dimension count {n_rot} does not fit head dim "
                                           f"{head_dim}")
        for name in ("n_ff_layers", "n_head_kv_layers"):
            values = getattr(hp, name)
            if values and (len(values) != hp.n_layer or min(values) <= 0):
                raise ModelLoadError(path, f"{name}: {len(values)} values for {hp.n_layer} "
                                           "layers, each must be > 0")
        if any(hp.n_head % hp.layer_n_head_kv(li) for li in range(hp.n_layer)):
            raise ModelLoadError(path, "a layer's attention heads cannot share its KV heads")
        if hp.swa_pattern and len(hp.swa_pattern) != hp.n_layer:
            raise ModelLoadError(path, f"the sliding-window pattern has {len(hp.swa_pattern)} "
                                       f"layers, the model {hp.n_layer}")
        if hp.kv_from and (len(hp.kv_from) != hp.n_layer or any(
                not (hp.has_kv(src) and src <= li and hp.is_swa(src) == hp.is_swa(li)
                     and hp.layer_dims(src)["kv_dim"] == hp.layer_dims(li)["kv_dim"])
                for li, src in enumerate(hp.kv_from))):
            raise ModelLoadError(path, "a layer shares the KV cache of a layer that is not an "
                                       "earlier one of its kind with a cache of its own")
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
        if key.kind is tuple:  # an array the family reads per layer; one value stands for all
            items = list(value) if isinstance(value, list | tuple) else [value]
            if not all(isinstance(x, int | float) for x in items):  # bools are ints
                v.refuse(f"{full} = {value!r} is not an array of numbers")
            v[key.name] = tuple(items)
            continue
        if isinstance(value, list):  # per-layer arrays: one value for all layers, as llama's
            if not value or any(x != value[0] for x in value):
                v.refuse(f"{full}: per-layer values are not supported")
            value = value[0]
        kind: Any = key.kind  # int, float or str here
        try:
            v[key.name] = kind(value)
        except (TypeError, ValueError):
            v.refuse(f"{full} = {value!r} is not a {key.kind.__name__}")
    return v
