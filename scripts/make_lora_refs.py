"""Make tests/data/lora: LoRA adapter GGUFs for a tiny synth model and llama.cpp's logits with them.

Two steps, two interpreters (the adapters need only gguf-py and numpy; the logits need
llama-cpp-python, which modelyard never depends on):

    python scripts/make_lora_refs.py adapters
    /opt/llama-venv/bin/python scripts/make_lora_refs.py logits

The base is tests/data/synth/qwen2_d64_gqa2_bias_f32.gguf (and its Q8_0 twin, the same weights, so
one adapter fits both). adapter_a adapts attn_q (F32, rank 4), attn_v (F16, rank 4), ffn_up (F32,
rank 4) and ffn_down (F32, rank 2: ranks differ per tensor) with alpha 8; adapter_b adapts attn_k
and attn_output (rank 3, alpha 0: llama.cpp then uses the user scale alone).
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SYNTH = ROOT / "tests" / "data" / "synth"
OUT = ROOT / "tests" / "data" / "lora"
BASES = ("qwen2_d64_gqa2_bias_f32", "qwen2_d64_gqa2_bias_q8_0")
N_LAYER = 2
# adapter name -> (alpha, {tensor: (rank, float16?)})
ADAPTERS: dict[str, tuple[float, dict[str, tuple[int, bool]]]] = {
    "adapter_a": (8.0, {"attn_q": (4, False), "attn_v": (4, True), "ffn_up": (4, False),
                        "ffn_down": (2, False)}),
    "adapter_b": (0.0, {"attn_k": (3, False), "attn_output": (3, False)}),
}
SCALES = (1.0, 0.35)          # adapter_a alone at each
PAIR_SCALES = (0.7, 0.5)      # adapter_a and adapter_b together
B_SCALE = 1.3                 # adapter_b alone: F32 pairs only, so llama.cpp rounds nothing extra


def make_adapters() -> None:
    from gguf import GGUFReader, GGUFWriter

    base = GGUFReader(str(SYNTH / f"{BASES[0]}.gguf"))
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in base.tensors}  # ggml order
    rng = np.random.default_rng(31)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (alpha, tensors) in ADAPTERS.items():
        w = GGUFWriter(str(OUT / f"{name}.gguf"), "qwen2")
        w.add_string("general.type", "adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", alpha)
        for i in range(N_LAYER):
            for t, (rank, f16) in tensors.items():
                n_cols, n_rows = shapes[f"blk.{i}.{t}.weight"]
                a = rng.normal(0, 1 / np.sqrt(n_cols), (rank, n_cols))     # ggml [n_cols, rank]
                b = rng.normal(0, 0.6 / np.sqrt(rank), (n_rows, rank))     # ggml [rank, n_rows]
                dtype = np.float16 if f16 else np.float32
                w.add_tensor(f"blk.{i}.{t}.weight.lora_a", a.astype(dtype))
                w.add_tensor(f"blk.{i}.{t}.weight.lora_b", b.astype(dtype))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print("wrote", OUT / f"{name}.gguf")


def _logits(base: str, adapters: list[tuple[str, float]], ids: np.ndarray) -> np.ndarray:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(str(SYNTH / f"{base}.gguf"), n_ctx=64, n_batch=64, n_threads=2,
                logits_all=True, verbose=False)
    handles = []
    for path, _ in adapters:
        h = llama_cpp.llama_adapter_lora_init(llm._model.model, str(OUT / path).encode())
        if not h:
            raise RuntimeError(f"llama.cpp refused {path}")
        handles.append(h)
    if handles:
        arr = (llama_cpp.llama_adapter_lora_p_ctypes * len(handles))(*handles)
        scales = (ctypes.c_float * len(handles))(*[s for _, s in adapters])
        if llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, arr, len(handles), scales):
            raise RuntimeError("llama_set_adapters_lora failed")
    llm.reset()
    llm.eval([int(i) for i in ids])
    out = np.array(llm.scores[:len(ids)], dtype=np.float32)
    for h in handles:
        llama_cpp.llama_adapter_lora_free(h)
    llm.close()
    return out


def make_logits() -> None:
    for base in BASES:
        ids = np.load(SYNTH / f"{base}.npz")["ids"]
        out: dict[str, np.ndarray] = {"ids": ids, "scales": np.array(SCALES, np.float32),
                                      "pair_scales": np.array(PAIR_SCALES, np.float32),
                                      "b_scale": np.float32(B_SCALE)}
        plain = _logits(base, [], ids)
        out["plain"] = plain
        for k, s in enumerate(SCALES):
            out[f"logits_a{k}"] = _logits(base, [("adapter_a.gguf", s)], ids)
            print(base, "scale", s, "max |delta| vs plain",
                  float(np.abs(out[f"logits_a{k}"] - plain).max()))
        out["logits_b"] = _logits(base, [("adapter_b.gguf", B_SCALE)], ids)
        out["logits_pair"] = _logits(base, [("adapter_a.gguf", PAIR_SCALES[0]),
                                            ("adapter_b.gguf", PAIR_SCALES[1])], ids)
        print(base, "pair max |delta| vs plain", float(np.abs(out["logits_pair"] - plain).max()))
        np.savez_compressed(OUT / f"{base}.npz", **out)  # type: ignore[arg-type]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("step", choices=("adapters", "logits"))
    args = p.parse_args()
    make_adapters() if args.step == "adapters" else make_logits()


if __name__ == "__main__":
    sys.exit(main())
