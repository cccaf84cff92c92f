"""The float64 twin of engine/vision: a projector file read with gguf-py (not engine.gguf) and
run in float64 with plain numpy, written from llama.cpp's clip graphs, not from the engine's code.
Exact GELUs (no f16 table): what the engine rounds, this does not."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def _tensors(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    r = GGUFReader(path)
    md: dict[str, Any] = {}
    for f in r.fields.values():
        if f.types and f.types[0].name == "ARRAY":
            md[f.name] = [f.parts[i].tolist()[0] if f.parts[i].size == 1 else bytes(f.parts[i]).decode()
                          for i in f.data]
        elif f.data:
            v = f.parts[f.data[0]]
            md[f.name] = bytes(v).decode() if v.dtype == np.uint8 else v.tolist()[0]
    ts = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(int(np.prod(shape[:-1])), -1)
        ts[t.name] = dequantize(raw, t.tensor_type).astype(np.float64).reshape(shape)
    return md, ts


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def encode_reference(path: Path, pixels: np.ndarray) -> np.ndarray:
    """pixels float32 [3, S, S] -> float64 [n_tokens, n_embd], as llama.cpp's clip graph."""
    md, t = _tensors(path)
    k = "clip.vision."
    proj, p = md["clip.projector_type"], int(md[k + "patch_size"])
    n_head, eps = int(md[k + "attention.head_count"]), float(md[k + "attention.layer_norm_epsilon"])
    n_layer = int(md[k + "block_count"])
    c, s, _ = pixels.shape
    n = s // p
    conv = t["v.patch_embd.weight"]                     # [width, 3, p, p]
    patches = pixels.astype(np.float64).reshape(c, n, p, n, p).transpose(1, 3, 0, 2, 4).reshape(n * n, -1)
    x = patches @ conv.reshape(conv.shape[0], -1).T + t["v.patch_embd.bias"]
    if "v.class_embd" in t:                             # appended last, as ggml_concat(inp, cls, 1)
        x = np.concatenate([x, t["v.class_embd"][None]])
    x = x + t["v.position_embd.weight"]
    if "v.pre_ln.weight" in t:
        x = _ln(x, t["v.pre_ln.weight"], t["v.pre_ln.bias"], eps)
    for i in range(n_layer - 1 if proj == "mlp" else n_layer):
        b = f"v.blk.{i}."
        h = _ln(x, t[b + "ln1.weight"], t[b + "ln1.bias"], eps)
        q, kk, v = (h @ t[b + f"attn_{z}.weight"].T + t[b + f"attn_{z}.bias"] for z in "qkv")
        dh = q.shape[1] // n_head
        heads = []
        for j in range(n_head):
            sl = slice(j * dh, (j + 1) * dh)
            a = q[:, sl] @ kk[:, sl].T / math.sqrt(dh)
            a = np.exp(a - a.max(-1, keepdims=True))
            heads.append((a / a.sum(-1, keepdims=True)) @ v[:, sl])
        x = x + np.concatenate(heads, 1) @ t[b + "attn_out.weight"].T + t[b + "attn_out.bias"]
        h = _ln(x, t[b + "ln2.weight"], t[b + "ln2.bias"], eps)
        h = h @ t[b + "ffn_up.weight"].T + t[b + "ffn_up.bias"]
        h = _gelu(h) if md.get("clip.use_gelu") else h / (1 + np.exp(-1.702 * h))
        x = x + h @ t[b + "ffn_down.weight"].T + t[b + "ffn_down.bias"]
    if "v.post_ln.weight" in t:
        x = _ln(x, t["v.post_ln.weight"], t["v.post_ln.bias"], eps)
    f = int(md.get(k + "projector.scale_factor", 2))
    if proj == "gemma3":
        g = x.reshape(n // f, f, n // f, f, -1).mean(axis=(1, 3)).reshape((n // f) ** 2, -1)
        g = g / np.sqrt((g * g).mean(-1, keepdims=True) + eps) * t["mm.soft_emb_norm.weight"]
        return g @ t["mm.input_projection.weight"]      # numpy [width, n_embd]: x @ W
    if proj == "idefics3":
        g = x.reshape(n // f, f, n // f, f, -1).transpose(0, 2, 1, 3, 4).reshape((n // f) ** 2, -1)
        return g @ t["mm.model.fc.weight"].T
    h = _gelu(x[1:] @ t["mm.0.weight"].T + t["mm.0.bias"])   # rows 1..n_patch, as llama.cpp
    return h @ t["mm.2.weight"].T + t["mm.2.bias"]
