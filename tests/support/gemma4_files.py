"""Variants of the synth3 gemma4 files.

write_per_layer_variant: per-layer arrays, as llama.cpp's converter writes them for Gemma 4
models whose layers differ: `feed_forward_length` per layer (a double-wide MLP in the KV-sharing
layers) and `attention.head_count_kv` per layer (the full layers' own KV heads). The other
tensors and keys are the file's; the resized ones are new random F32 weights.
write_quantized_projection_variant: the Q8_0 file with `per_layer_model_proj` in Q8_0 too
(llama_model_quantize keeps it F32; a real file may not), so its per-layer row slices are
quantized rows."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

N_FF = [128, 128, 128, 128, 256, 256]     # layers 4 and 5 (they share KV) twice as wide
N_HEAD_KV = [1, 1, 1, 2, 1, 2]            # full layers (3, 5) with 2 KV heads of 32


def write_per_layer_variant(src: Path, dst: Path, seed: int = 28) -> Path:
    r = GGUFReader(src)
    rng = np.random.default_rng(seed)
    w = GGUFWriter(dst, "gemma4")
    for name, field in r.fields.items():
        if name.startswith(("GGUF.", "general.architecture")):
            continue
        value = field.contents()
        if name == "gemma4.feed_forward_length":
            value = N_FF
        elif name == "gemma4.attention.head_count_kv":
            value = N_HEAD_KV
        if isinstance(value, list):
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, field.types[0])
    n_embd = 64

    def weight(rows: int, cols: int) -> np.ndarray:  # numpy [rows, cols] = ggml (cols, rows)
        return (rng.normal(size=(rows, cols)) / np.sqrt(cols)).astype(np.float32)

    for t in r.tensors:
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else -1
        part = t.name.split(".", 2)[-1]
        data = np.asarray(t.data)
        if layer >= 0 and part in ("ffn_gate.weight", "ffn_up.weight"):
            data = weight(N_FF[layer], n_embd)
        elif layer >= 0 and part == "ffn_down.weight":
            data = weight(n_embd, N_FF[layer]) * 3
        elif layer >= 0 and part in ("attn_k.weight", "attn_v.weight"):
            data = weight(N_HEAD_KV[layer] * data.shape[0], n_embd)  # the file has 1 KV head
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def write_quantized_projection_variant(src: Path, dst: Path) -> Path:
    r = GGUFReader(src)
    w = GGUFWriter(dst, "gemma4")
    for name, field in r.fields.items():
        if name.startswith(("GGUF.", "general.architecture")):
            continue
        value = field.contents()
        if isinstance(value, list):
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, field.types[0])
    for t in r.tensors:
        if t.name == "per_layer_model_proj.weight":
            q8 = quantize(np.asarray(t.data, np.float32), GGMLQuantizationType.Q8_0)
            w.add_tensor(t.name, q8, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
