"""A vision projector file (llama.cpp's mmproj GGUF, `general.architecture = clip`): its
hyperparameters and its tensors, named as the encoder and projectors use them.

    v.patch_embd.weight   ggml [p, p, 3, width]  -> QuantMatrix [width, 3*p*p] (one conv = a matmul)
    v.position_embd       ggml [width, n_pos]    -> float32 [n_pos, width]
    v.blk.{i}.*           ln1, attn_q/k/v/out, ln2, ffn_up/down (with biases)
    v.pre_ln / v.post_ln  optional LayerNorms; v.class_embd optional (CLIP's class token)
    mm.*                  the projector's own tensors (projectors.py names them per type)

Weights may be F32, F16, BF16 or Q8_0 (engine/formats decodes them; the matmul kernels take the
2-D ones as they are). Only the header decides whether a file is usable, so config checks
(`check_header`) and the loader agree on what is refused.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.formats import quants
from engine.formats.ggml_types import GGMLQuantizationType as T
from engine.gguf import GGUFFile, ModelLoadError, TensorInfo

WEIGHT_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q8_0})
PROJECTORS = ("gemma3", "idefics3", "mlp")


@dataclass(frozen=True)
class VisionParams:
    projector: str                 # clip.projector_type
    image_size: int                # the encoder's square input side
    patch_size: int
    width: int                     # clip.vision.embedding_length
    n_head: int
    n_ff: int
    n_layer: int                   # blocks in the file
    projection_dim: int            # the text model's n_embd the projector writes
    eps: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    use_gelu: bool                 # GELU (tanh) in the FFN, else quick-GELU (CLIP)
    scale_factor: int              # gemma3's pool / idefics3's pixel shuffle
    preproc_image_size: int        # idefics3's longest edge before tiling (0: no tiling)

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


def _int(md: dict[str, Any], key: str, path: str, default: int | None = None) -> int:
    v = md.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ModelLoadError(path, f"{key} is {v!r}, expected a non-negative integer")
    return v


def check_header(path: str | os.PathLike[str], md: dict[str, Any],
                 tensors: dict[str, TensorInfo]) -> VisionParams:
    """The hyperparameters of a projector file, or a ModelLoadError saying why it is unusable."""
    p = str(path)
    if md.get("general.architecture") != "clip":
        raise ModelLoadError(p, f"general.architecture is {md.get('general.architecture')!r}, "
                                f"an mmproj file says 'clip'")
    if md.get("clip.has_vision_encoder") is False:
        raise ModelLoadError(p, "the file has no vision encoder")
    proj = md.get("clip.projector_type")
    if proj not in PROJECTORS:
        raise ModelLoadError(p, f"projector type {proj!r} is not supported "
                                f"(supported: {', '.join(PROJECTORS)})")
    for name, t in tensors.items():
        if t.qtype not in WEIGHT_TYPES:
            raise ModelLoadError(p, f"tensor {name}: type {t.qtype.name} is not supported in "
                                    f"a projector (supported: F32, F16, BF16, Q8_0)")
    mean = tuple(float(x) for x in md.get("clip.vision.image_mean", ()))
    std = tuple(float(x) for x in md.get("clip.vision.image_std", ()))
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ModelLoadError(p, "clip.vision.image_mean / image_std must be 3 values (std > 0)")
    k = "clip.vision."
    hp = VisionParams(
        projector=proj, image_size=_int(md, k + "image_size", p), patch_size=_int(md, k + "patch_size", p),
        width=_int(md, k + "embedding_length", p), n_head=_int(md, k + "attention.head_count", p),
        n_ff=_int(md, k + "feed_forward_length", p), n_layer=_int(md, k + "block_count", p),
        projection_dim=_int(md, k + "projection_dim", p),
        eps=float(md.get(k + "attention.layer_norm_epsilon", 1e-6)),
        mean=(mean[0], mean[1], mean[2]), std=(std[0], std[1], std[2]),
        use_gelu=bool(md.get("clip.use_gelu", False)),
        # Gemma 3's files leave it out: mtmd's default pool is 4x4 (64 patches a side -> 256 rows)
        scale_factor=_int(md, k + "projector.scale_factor", p, 4 if proj == "gemma3" else 1),
        preproc_image_size=_int(md, k + "preproc_image_size", p, 0))
    if hp.patch_size == 0 or hp.image_size % hp.patch_size or hp.n_head == 0 or hp.width % hp.n_head:
        raise ModelLoadError(p, f"image size {hp.image_size}, patch {hp.patch_size}, width "
                                f"{hp.width} and {hp.n_head} heads do not fit together")
    if proj in ("gemma3", "idefics3") and (hp.scale_factor < 1
                                           or hp.patches_per_side % hp.scale_factor):
        raise ModelLoadError(p, f"scale factor {hp.scale_factor} does not divide "
                                f"{hp.patches_per_side} patches per side")
    return hp


def projection_width(path: str | os.PathLike[str], md: dict[str, Any],
                     tensors: dict[str, TensorInfo]) -> int:
    """The embedding width the projector writes (what the text model's n_embd must be)."""
    return check_header(path, md, tensors).projection_dim


@dataclass
class VisionLayer:
    ln1_w: np.ndarray                 # float32 [width]
    ln1_b: np.ndarray
    q: quants.QuantMatrix             # [width, width]
    q_b: np.ndarray
    k: quants.QuantMatrix
    k_b: np.ndarray
    v: quants.QuantMatrix
    v_b: np.ndarray
    out: quants.QuantMatrix
    out_b: np.ndarray
    ln2_w: np.ndarray
    ln2_b: np.ndarray
    up: quants.QuantMatrix            # [n_ff, width]
    up_b: np.ndarray
    down: quants.QuantMatrix          # [width, n_ff]
    down_b: np.ndarray


class Projector:
    """An opened projector file: VisionParams plus its tensors (views into the mapping)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.file = GGUFFile(path)
        try:
            self.path = str(path)
            self.hp = check_header(path, self.file.metadata, self.file.tensors)
            self._used: set[str] = set()
            hp = self.hp
            pp = hp.patch_size * hp.patch_size * 3
            self.patch_embd = self.matrix("v.patch_embd.weight", pp, hp.width,
                                          shape=(hp.patch_size, hp.patch_size, 3, hp.width))
            self.patch_bias = self.vector("v.patch_embd.bias", hp.width)
            self.class_embd = self.optional_vector("v.class_embd", hp.width)
            n_pos = hp.patches_per_side ** 2 + (self.class_embd is not None)
            self.position_embd = self.dense("v.position_embd.weight", (hp.width, n_pos))
            self.pre_ln = self.norm("v.pre_ln", required=False)
            self.post_ln = self.norm("v.post_ln", required=False)
            self.layers = [self.layer(i) for i in range(hp.n_layer)]
        except BaseException:
            self.file.close()
            raise

    def _info(self, name: str, shape: tuple[int, ...]) -> TensorInfo:
        t = self.file.tensors.get(name)
        if t is None:
            raise ModelLoadError(self.path, f"tensor {name} is missing")
        if t.shape != shape:
            raise ModelLoadError(self.path, f"tensor {name} has shape {list(t.shape)}, "
                                            f"expected {list(shape)}")
        self._used.add(name)
        return t

    def has(self, name: str) -> bool:
        return name in self.file.tensors

    def matrix(self, name: str, n_cols: int, n_rows: int,
               shape: tuple[int, ...] | None = None) -> quants.QuantMatrix:
        """A 2-D weight as the matmul kernels take it: out[r] = dot(W[r], x), [n_rows, n_cols]."""
        t = self._info(name, shape or (n_cols, n_rows))
        raw = self.file.tensor_data(name).reshape(n_rows, -1)
        return quants.QuantMatrix(raw, t.qtype, n_rows, n_cols)

    def dense(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Any tensor decoded to float32, numpy order (ggml's shape reversed)."""
        t = self._info(name, shape)
        raw = self.file.tensor_data(name).reshape(-1, quants.row_bytes(t.qtype, shape[0]))
        return np.ascontiguousarray(quants.dequantize(raw, t.qtype, shape[0]).reshape(shape[::-1]))

    def vector(self, name: str, n: int) -> np.ndarray:
        return self.dense(name, (n,))

    def optional_vector(self, name: str, n: int) -> np.ndarray | None:
        return self.dense(name, (n,)) if name in self.file.tensors else None

    def norm(self, prefix: str, required: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        if not required and prefix + ".weight" not in self.file.tensors:
            return None
        w = self.hp.width
        return self.vector(prefix + ".weight", w), self.vector(prefix + ".bias", w)

    def layer(self, i: int) -> VisionLayer:
        w, f, b = self.hp.width, self.hp.n_ff, f"v.blk.{i}."
        vec = self.vector
        return VisionLayer(
            vec(b + "ln1.weight", w), vec(b + "ln1.bias", w),
            self.matrix(b + "attn_q.weight", w, w), vec(b + "attn_q.bias", w),
            self.matrix(b + "attn_k.weight", w, w), vec(b + "attn_k.bias", w),
            self.matrix(b + "attn_v.weight", w, w), vec(b + "attn_v.bias", w),
            self.matrix(b + "attn_out.weight", w, w), vec(b + "attn_out.bias", w),
            vec(b + "ln2.weight", w), vec(b + "ln2.bias", w),
            self.matrix(b + "ffn_up.weight", w, f), vec(b + "ffn_up.bias", f),
            self.matrix(b + "ffn_down.weight", f, w), vec(b + "ffn_down.bias", w))

    def unused(self) -> list[str]:
        return sorted(set(self.file.tensors) - self._used)

    def close(self) -> None:
        self.layers = []
        self.file.close()


_PACKED = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_out.weight", "ffn_up.weight",
           "ffn_down.weight")


def resident_bytes(path: str | os.PathLike[str], amx: bool) -> int:
    """Memory a loaded projector holds: its file's size (weights are read into memory of their
    own), plus, with the AMX GEMM (engine/kernels/amx_gemm), a second 2 bytes per F16 weight
    it packs: its bf16 halves take 4 bytes an element where the file's F16 take 2."""
    size = os.path.getsize(path)
    if not amx:
        return size
    f = GGUFFile(path)
    try:
        extra = sum(t.n_bytes for name, t in f.tensors.items() if t.qtype == T.F16 and (
            name == "v.patch_embd.weight" or (name.startswith("v.blk.") and name.endswith(_PACKED))))
    finally:
        f.close()
    return size + extra
