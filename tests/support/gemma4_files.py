"""Variants of the synth3 gemma4 file with per-layer arrays, as llama.cpp's converter writes them
for Gemma 4 models whose layers differ: `feed_forward_length` per layer (a double-wide MLP in the
KV-sharing layers) and `attention.head_count_kv` per layer (the full layers' own KV heads).
The other tensors and keys are the file's; the resized ones are new random F32 weights."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

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
