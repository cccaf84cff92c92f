"""Hyperparameters of a llama-family model, read from GGUF metadata and checked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .gguf import ModelLoadError

SUPPORTED_ARCHS = ("llama",)


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

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    def kv_bytes_per_token(self) -> int:
        """f16 keys + values over all layers for one cached token."""
        return 2 * 2 * self.n_layer * self.kv_dim

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], path: str) -> "HParams":
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ModelLoadError(path, f"unsupported architecture {arch!r} "
                                       f"(supported: {', '.join(SUPPORTED_ARCHS)})")

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
        n_rot = get("rope.dimension_count", head_dim)
        scaling = meta.get(f"{arch}.rope.scaling.type", "none")
        factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        if scaling not in ("none", "linear") and factor != 1.0:
            raise ModelLoadError(path, f"rope scaling {scaling!r} is not supported")
        vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        hp = cls(
            arch=arch,
            n_vocab=int(vocab),
            n_ctx_train=get("context_length", 2048),
            n_embd=n_embd,
            n_layer=get("block_count"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=get("feed_forward_length"),
            n_rot=n_rot,
            rope_base=get("rope.freq_base", 10000.0, float),
            rope_freq_scale=1.0 / factor if scaling == "linear" else 1.0,
            rms_eps=get("attention.layer_norm_rms_epsilon", 1e-5, float),
        )
        for name in ("n_vocab", "n_embd", "n_layer", "head_dim", "n_ff"):
            if getattr(hp, name) <= 0:
                raise ModelLoadError(path, f"hyperparameter {name} = {getattr(hp, name)} must be > 0")
        if n_rot > head_dim or n_rot % 2:
            raise ModelLoadError(path, f"rope dimension count {n_rot} does not fit head dim {head_dim}")
        return hp
