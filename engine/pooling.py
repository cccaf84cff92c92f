"""From a text's final hidden states to what an embedding or rerank request returns
(llama-graph.cpp's build_pooling, and common_embd_normalize for the L2 norm).

    none  every token's vector, [n, n_embd]
    mean  their mean                                  (BGE, e5, all-MiniLM, nomic-embed)
    cls   the first token's ([CLS])                   (some BERTs)
    last  the last token's                            (Qwen3-Embedding: its appended end token)
    rank  the classifier (weights.RankHead) on the first token's (an encoder) or the last's (a
          decoder), [n_cls_out] scores; a qwen3 head's two rows (yes, no) go through a softmax,
          so score 0 is P(yes) (Qwen3-Reranker, as llama.cpp does for that family)

The kind comes from the file (`<arch>.pooling_type`, llama.cpp's enum) unless the entry names
one; a file that says nothing pools by its mean, as llama.cpp's decoders do here.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .weights import RankHead

POOLINGS = ("none", "mean", "cls", "last", "rank")
_BY_NUMBER = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama_pooling_type
SOFTMAX_RANK_ARCHS = frozenset({"qwen3", "qwen3vl"})


def file_pooling(meta: Mapping[str, Any], arch: str) -> str | None:
    """The file's pooling kind, or None when it names none (or one llama.cpp does not know)."""
    value = meta.get(f"{arch}.pooling_type")
    return _BY_NUMBER.get(value) if isinstance(value, int) else None


def pool(hidden: np.ndarray, kind: str, head: RankHead | None = None, causal: bool = False,
         softmax: bool = False) -> np.ndarray:
    """hidden float32 [n, n_embd] -> float32: [n, n_embd] (none), [n_embd] or [n_cls_out] (rank).
    causal: a decoder, whose rank head reads the last token rather than the first."""
    if hidden.ndim != 2 or hidden.shape[0] == 0:
        raise ValueError(f"pooling needs [n >= 1, n_embd] hidden states, got {hidden.shape}")
    if kind == "none":
        return np.array(hidden, dtype=np.float32)
    if kind == "mean":
        return np.asarray(hidden.mean(axis=0, dtype=np.float32), dtype=np.float32)
    if kind == "cls":
        return np.array(hidden[0], dtype=np.float32)
    if kind == "last":
        return np.array(hidden[-1], dtype=np.float32)
    if kind == "rank":
        if head is None:
            raise ValueError("rank pooling needs a classifier (cls.* tensors): the file has none")
        return rank_scores(hidden[-1] if causal else hidden[0], head, softmax)
    raise ValueError(f"unknown pooling {kind!r} (one of {', '.join(POOLINGS)})")


def rank_scores(h: np.ndarray, head: RankHead, softmax: bool) -> np.ndarray:
    """float32 [n_cls_out] (or [n_embd] for a head without cls.output) of one pooled row."""
    x = h.astype(np.float32)                                        # [n_embd]
    if head.cls is not None:
        x = head.cls @ x                                            # [n_embd]
        if head.cls_b is not None:
            x = x + head.cls_b
        x = np.tanh(x)
    if head.cls_out is not None:
        x = head.cls_out @ x                                        # [n_cls_out]
        if head.cls_out_b is not None:
            x = x + head.cls_out_b
    if softmax:
        e = np.exp(x - x.max())
        x = e / e.sum()
    return np.asarray(x, dtype=np.float32)


def normalize(v: np.ndarray) -> np.ndarray:
    """v / ||v||_2 over its last axis (0 stays 0), as llama.cpp's --embd-normalize 2."""
    v64 = v.astype(np.float64)
    norm = np.sqrt((v64 * v64).sum(axis=-1, keepdims=True))
    scale = np.where(norm > 0, 1.0 / np.where(norm > 0, norm, 1.0), 0.0)
    return (v64 * scale).astype(np.float32)


ROLES = ("generation", "embedding", "rerank")


def model_role(meta: Mapping[str, Any], arch: str, is_encoder: bool,
               pooling: str | None = None) -> str:
    """What a model serves, from its header and the entry's pooling: an encoder, a file naming
    a pooling type (llama.cpp's embedding GGUFs: Qwen3-Embedding LAST, Qwen3-Reranker RANK) or
    an entry naming one embeds, ranking with rank pooling; any other model generates."""
    return role_of(pooling or file_pooling(meta, arch), is_encoder)


def role_of(pooling: str | None, is_encoder: bool) -> str:
    """model_role of a model whose entry's or file's pooling (None: neither names one) is known."""
    if pooling is None and not is_encoder:
        return "generation"
    return "rerank" if pooling == "rank" else "embedding"
