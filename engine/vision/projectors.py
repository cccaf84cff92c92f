"""The projector heads: the ViT's output -> rows of the text model's embedding width.

    gemma3    [36, w] -> 2-D average pool by scale_factor (tokens row by row) -> RMS norm
              (vision eps) * mm.soft_emb_norm.weight (as stored, no +1) -> x @ mm.input_projection
              (stored [w, n_embd]: it is used transposed, as llama.cpp's ggml_transpose)
    idefics3  pixel shuffle by scale_factor (ggml's build_patch_merge_permute: each output row
              holds a s x s block of patches, features ordered (dy, dx, channel)) -> mm.model.fc
    mlp       rows 1..n_patch (llama.cpp's `patches` = i + 1 over a class token it appended
              LAST: patch 0 is dropped and the class token kept; the references agree)
              -> mm.0 (+bias) -> GELU (tanh) -> mm.2 (+bias)
"""
from __future__ import annotations

import numpy as np

from engine.formats import quants
from engine.kernels import ops
from engine.vision.encoder import VisionEncoder, f32_matrix, gelu
from engine.vision.mmproj import Projector


class Head:
    def __init__(self, proj: Projector) -> None:
        hp, n_embd = proj.hp, proj.hp.projection_dim
        self.hp = hp
        w, s = hp.width, hp.scale_factor
        if hp.projector == "gemma3":
            self.soft_norm = proj.vector("mm.soft_emb_norm.weight", w)
            # ggml [n_embd, w] is numpy [w, n_embd], used as x @ W: the kernels want W^T rows
            self.weights: list[quants.QuantMatrix] = [
                f32_matrix(proj.dense("mm.input_projection.weight", (n_embd, w)).T)]
            self.biases: list[np.ndarray | None] = [None]
        elif hp.projector == "idefics3":
            self.weights = [proj.matrix("mm.model.fc.weight", w * s * s, n_embd)]
            self.biases = [None]
        elif hp.projector == "mlp":
            hidden = proj.file.tensors["mm.0.weight"].shape[1] if proj.has("mm.0.weight") else 0
            self.weights = [proj.matrix("mm.0.weight", w, hidden), proj.matrix("mm.2.weight", hidden, n_embd)]
            self.biases = [proj.vector("mm.0.bias", hidden), proj.vector("mm.2.bias", n_embd)]
        else:
            raise ValueError(f"no projector head for {hp.projector!r}")

    def apply(self, enc: VisionEncoder, x: np.ndarray) -> np.ndarray:
        """x float32 [n_pos, width] (the ViT's output) -> float32 [n_tokens, n_embd]."""
        hp, side, s = self.hp, self.hp.patches_per_side, self.hp.scale_factor
        if hp.projector == "gemma3":
            g = x.reshape(side // s, s, side // s, s, hp.width).mean(axis=(1, 3), dtype=np.float32)
            g = np.ascontiguousarray(g.reshape(-1, hp.width))
            g = ops.rms_norm(g, self.soft_norm, hp.eps)
            return enc.linear(self.weights[0], g)
        if hp.projector == "idefics3":
            g = x.reshape(side // s, s, side // s, s, hp.width).transpose(0, 2, 1, 3, 4)
            return enc.linear(self.weights[0], np.ascontiguousarray(g.reshape(-1, hp.width * s * s)))
        h = enc.linear(self.weights[0], np.ascontiguousarray(x[1:]), self.biases[0])
        return enc.linear(self.weights[1], gelu(h), self.biases[1])
