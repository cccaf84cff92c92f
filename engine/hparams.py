"""Hyperparameters of a model, read from GGUF metadata and checked; the family's spec
(engine.arch) says which keys it has beyond llama's. A key the engine cannot honour is refused
here, at load, rather than ignored."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arch import SPECS, ArchSpec
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
    rope_base_swa: float = 0.0    # local layers' rope base (their freq scale is 1)
    attn_scale: float = 0.0       # q . k scale; 0: 1 / sqrt(head_dim)
    attn_softcap: float = 0.0     # 0: off
    final_softcap: float = 0.0    # 0: off
    embed_scale: float = 1.0      # the embedding row's factor (gemma: sqrt(n_embd) as float32)
    n_ctx_orig: int = 0           # rope.scaling.original_context_length (LongRoPE's switch)

    @property
    def spec(self) -> ArchSpec:
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

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], path: str) -> HParams:
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ModelLoadError(path, f"unsupported architecture {arch!r} "
                                       f"(supported: {', '.join(SUPPORTED_ARCHS)})")
        spec = SPECS[arch]

        def get(key: str, default: Any = None, kind: type = int) -> Any:
            full = f"{arch}.{key}"
            value = meta.get(full, default)
            if value is None:
                raise ModelLoadError(path, f"metadata key {full} is missing")
            if isinstance(value, list):  # per-layer arrays: llama uses one value for all layers
                if not value or any(v != value[0] for v in value):
                    raise ModelLoadError(path, f"{full}: per-layer values are not supported")
                value = value[0]
            try:
                return kind(value)
            except (TypeError, ValueError):
                raise ModelLoadError(path, f"{full} = {value!r} is not a {kind.__name__}") from None

        n_embd = get("embedding_length")
        n_head = get("attention.head_count")
        n_head_kv = get("attention.head_count_kv", n_head)
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise ModelLoadError(path, f"{n_head} attention heads cannot share {n_head_kv} KV heads")
        head_dim = get("attention.key_length", n_embd // n_head)
        if get("attention.value_length", head_dim) != head_dim:
            raise ModelLoadError(path, f"{arch}.attention.value_length differs from key_length "
                                       "(not supported)")
        n_rot = get("rope.dimension_count", head_dim)
        scaling = meta.get(f"{arch}.rope.scaling.type", "none")
        factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        if scaling not in ("none", "linear") and factor != 1.0:
            raise ModelLoadError(path, f"rope scaling {scaling!r} is not supported")
        attn_factor = float(meta.get(f"{arch}.rope.scaling.attn_factor", 1.0) or 1.0)
        if attn_factor != 1.0:
            raise ModelLoadError(path, f"{arch}.rope.scaling.attn_factor = {attn_factor} "
                                       "(rope magnitude scaling) is not supported")
        n_layer = get("block_count")
        window = get("attention.sliding_window", 0) if spec.swa_period else 0
        f32 = np.float32

        def softcap(key: str, used: bool) -> float:
            value = float(meta.get(f"{arch}.{key}", 0.0) or 0.0) if used else 0.0
            if value < 0:
                raise ModelLoadError(path, f"{arch}.{key} = {value} must be >= 0")
            return value

        vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        hp = cls(
            arch=arch,
            n_vocab=int(vocab),
            n_ctx_train=get("context_length", 2048),
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=get("feed_forward_length"),
            n_rot=n_rot,
            rope_base=get("rope.freq_base", 10000.0, float),
            rope_freq_scale=1.0 / factor if scaling == "linear" else 1.0,
            rms_eps=get("attention.layer_norm_rms_epsilon", 1e-5, float),
            window=window,
            swa_period=spec.swa_period if window else 0,
            rope_base_swa=get("rope.freq_base_swa", spec.swa_rope_base or
                              get("rope.freq_base", 10000.0, float), float) if window else 0.0,
            attn_scale=1.0 / math.sqrt(n_embd // n_head) if n_layer in spec.embd_scale_layers else 0.0,
            attn_softcap=softcap("attn_logit_softcapping", spec.attn_softcap),
            final_softcap=softcap("final_logit_softcapping", spec.final_softcap),
            embed_scale=float(f32(np.sqrt(f32(n_embd)))) if spec.embed_scale else 1.0,
            n_ctx_orig=get("rope.scaling.original_context_length", 0),
        )
        if window < 0:
            raise ModelLoadError(path, f"{arch}.attention.sliding_window = {window} must be >= 0")
        for name in ("n_vocab", "n_embd", "n_layer", "head_dim", "n_ff"):
            if getattr(hp, name) <= 0:
                raise ModelLoadError(path, f"hyperparameter {name} = {getattr(hp, name)} must be > 0")
        if head_dim % 8:
            raise ModelLoadError(path, f"head dim {head_dim} is not a multiple of 8 (the attention "
                                       "kernel's vectors)")
        if n_rot > head_dim or n_rot % 2:
            raise ModelLoadError(path, f"rope dimension count {n_rot} does not fit head dim {head_dim}")
        return hp
