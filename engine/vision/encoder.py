"""The vision transformer of a projector file (SigLIP or CLIP), as llama.cpp's clip graph runs it.

    pixels  float32 [3, S, S]
    patches [n_patch, 3*p*p]  (channel, row, column) per patch, patches row by row
    x = patches @ patch_embd^T + bias            [n_patch, width]
        (CLIP: the class token APPENDED, as llama.cpp's ggml_concat(inp, class_embd, 1) does;
        position_embd row n_patch is then the class token's)  [n_pos, width]
    x += position_embd;  x = pre_ln(x) if the file has it
    per block:  x += attn_out(attention(ln1(x)));  x += ffn_down(act(ffn_up(ln2(x))))
        (non-causal: every position sees every other)
    x = post_ln(x) if the file has it            [n_pos, width]

Matmuls (the weights and the attention's QK^T and PV alike) go through the engine's matmul
kernels (engine/kernels/matmul) on QuantMatrix operands; biases, softmax and the tanh GELU are
the glue kernels of engine/kernels/ops (GELU with ggml's f16 table). LayerNorm and quick-GELU are
numpy here (no compiled kernel for them yet); tests/support/vision_reference.py is the float64
twin of the whole encoder, and llama.cpp's own embeddings (tests/data/vlm/) the outside check.
"""
from __future__ import annotations

import math

import numpy as np

from engine.formats import quants
from engine.formats.ggml_types import GGMLQuantizationType as T
from engine.kernels import ops
from engine.kernels.matmul import MatmulKernels
from engine.vision.mmproj import Projector, VisionLayer, VisionParams


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """ggml_norm then * w + b, per row; x float32 [n, width]."""
    mean = x.mean(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    d = x - mean
    var = (d * d).mean(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    return np.ascontiguousarray(d / np.sqrt(var + np.float32(eps)) * w + b, dtype=np.float32)


def _f16_table(f: np.ndarray) -> np.ndarray:
    return f.astype(np.float16).astype(np.float32)


def gelu_quick(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(1.702 x) through ggml's f16 table: f16 input, f16 result."""
    h = _f16_table(x).astype(np.float64)
    with np.errstate(over="ignore"):
        return _f16_table((h / (1.0 + np.exp(-1.702 * h))).astype(np.float32))


def gelu(x: np.ndarray) -> np.ndarray:
    """The tanh GELU with ggml's f16 table (ops.gelu_mul by ones)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return ops.gelu_mul(x, np.ones_like(x))


def f32_matrix(a: np.ndarray) -> quants.QuantMatrix:
    """A float32 [n_rows, n_cols] array as an F32 QuantMatrix (no copy if already contiguous)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    return quants.QuantMatrix(a.view(np.uint8).reshape(a.shape[0], -1), T.F32, a.shape[0], a.shape[1])


def patchify(pixels: np.ndarray, p: int) -> np.ndarray:
    """float32 [3, S, S] -> [n_patch, 3*p*p], as ggml's im2col lays out a stride-p conv."""
    c, h, w = pixels.shape
    x = pixels.reshape(c, h // p, p, w // p, p).transpose(1, 3, 0, 2, 4)  # [py, px, c, ky, kx]
    return np.ascontiguousarray(x.reshape((h // p) * (w // p), c * p * p), dtype=np.float32)


class VisionEncoder:
    """Runs one projector file's ViT; `mk` is shared with its projector head."""

    def __init__(self, proj: Projector, n_threads: int = 1) -> None:
        self.proj, self.hp = proj, proj.hp
        types = {m.qtype for layer in proj.layers for m in (layer.q, layer.k, layer.v, layer.out,
                                                            layer.up, layer.down)}
        types |= {proj.patch_embd.qtype, T.F32}
        for name in ("mm.input_projection.weight", "mm.model.fc.weight", "mm.0.weight", "mm.2.weight"):
            if proj.has(name):
                types.add(proj.file.tensors[name].qtype)
        self.mk = MatmulKernels(types, n_threads=n_threads)

    def linear(self, w: quants.QuantMatrix, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        out = self.mk.matmul(w, x)
        return ops.add_bias(out, b, out=out) if b is not None else out

    def attention(self, layer: VisionLayer, x: np.ndarray) -> np.ndarray:
        hp: VisionParams = self.hp
        n, dh = x.shape[0], hp.width // hp.n_head
        q = self.linear(layer.q, x, layer.q_b).reshape(n, hp.n_head, dh)
        k = self.linear(layer.k, x, layer.k_b).reshape(n, hp.n_head, dh)
        v = self.linear(layer.v, x, layer.v_b).reshape(n, hp.n_head, dh)
        heads = np.empty((n, hp.n_head, dh), np.float32)
        scale = np.float32(1.0 / math.sqrt(dh))
        for h in range(hp.n_head):
            scores = self.mk.matmul(f32_matrix(k[:, h]), q[:, h])   # [n_q, n_k]
            probs = ops.softmax(ops.scale(scores, float(scale), out=scores), out=scores)
            heads[:, h] = self.mk.matmul(f32_matrix(v[:, h].T), probs)  # [n_q, dh]
        return self.linear(layer.out, heads.reshape(n, hp.width), layer.out_b)

    def block(self, layer: VisionLayer, x: np.ndarray) -> np.ndarray:
        hp = self.hp
        x = x + self.attention(layer, layer_norm(x, layer.ln1_w, layer.ln1_b, hp.eps))
        h = self.linear(layer.up, layer_norm(x, layer.ln2_w, layer.ln2_b, hp.eps), layer.up_b)
        h = gelu(h) if hp.use_gelu else gelu_quick(h)
        out: np.ndarray = x + self.linear(layer.down, h, layer.down_b)
        return out

    def n_layers_run(self) -> int:
        """LLaVA's feature is the second-to-last block's output; the others run every block."""
        return self.hp.n_layer - 1 if self.hp.projector == "mlp" else self.hp.n_layer

    def vit(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [3, S, S] -> float32 [n_pos, width] (CLS included where the file has one)."""
        proj, hp = self.proj, self.hp
        if pixels.shape != (3, hp.image_size, hp.image_size):
            raise ValueError(f"pixels must be [3, {hp.image_size}, {hp.image_size}], got {pixels.shape}")
        x = self.linear(proj.patch_embd, patchify(pixels, hp.patch_size), proj.patch_bias)
        if proj.class_embd is not None:
            x = np.concatenate([x, proj.class_embd[None, :]])
        x = np.ascontiguousarray(x + proj.position_embd, dtype=np.float32)
        if proj.pre_ln is not None:
            x = layer_norm(x, *proj.pre_ln, hp.eps)
        for layer in proj.layers[:self.n_layers_run()]:
            x = np.ascontiguousarray(self.block(layer, x), dtype=np.float32)
        if proj.post_ln is not None:
            x = layer_norm(x, *proj.post_ln, hp.eps)
        return x

    def close(self) -> None:
        self.mk.close()
