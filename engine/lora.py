"""LoRA adapters (llama.cpp's GGUF adapter files) applied to a model's matrices at load.

    LoraSpec      one adapter to apply: its file and the user's scale
    read_deltas   the adapters' files -> {base tensor name: [LoraDelta, ...]}, checked against the
                  base (architecture, tensor names and shapes), as llama.cpp's
                  llama_adapter_lora_init checks them
    merged        a base matrix of any type with its deltas added: float32 W + sum(scale * B @ A)

A file is an adapter when `general.type = adapter` and `adapter.type = lora`; each adapted base
tensor X has a pair X.lora_a (ggml [n_cols, rank]) and X.lora_b (ggml [rank, n_rows]). The
effective scale is llama.cpp's (llama_adapter_lora_weight::get_scale): user scale * alpha / rank,
or the user scale alone when alpha is 0. llama.cpp adds scale * B (A x) beside each adapted
matmul; merging once at load computes the same product with no per-token cost, at the price of
holding the adapted matrices in float32 (their quantized bytes are not used: a quantized base's
adapted matmuls then see unrounded activations, well inside the synth tolerances).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .formats import quants
from .formats.ggml_types import GGMLQuantizationType
from .gguf import GGUFFile, ModelLoadError, TensorInfo, read_header


@dataclass(frozen=True)
class LoraSpec:
    path: str | os.PathLike[str]
    scale: float = 1.0


@dataclass(frozen=True)
class LoraDelta:
    a: np.ndarray   # float32 [rank, n_cols]
    b: np.ndarray   # float32 [n_rows, rank]
    scale: float    # effective: user scale * alpha / rank
    adapter: int = 0    # which of the load's adapters (its index in the LoraSpec list)
    unit: float = 1.0   # effective scale per unit of user scale: alpha / rank, or 1


def _floats(f: GGUFFile, t: TensorInfo) -> np.ndarray:
    cols, rows = t.shape
    raw = f.tensor_data(t.name).reshape(rows, -1)
    return np.asarray(quants.dequantize(raw, t.qtype, cols), dtype=np.float32).reshape(rows, cols)


def read_deltas(specs: list[LoraSpec], arch: str,
                base: dict[str, TensorInfo]) -> dict[str, list[LoraDelta]]:
    """Every adapter's deltas by the base tensor they adapt; a file that is not a LoRA adapter,
    one made for another architecture, or one whose tensors the base lacks or shapes differently,
    is a ModelLoadError naming the adapter file."""
    out: dict[str, list[LoraDelta]] = {}
    for index, spec in enumerate(specs):
        path = Path(spec.path)
        if not path.is_file():
            raise ModelLoadError(path, "LoRA adapter file not found")
        f = GGUFFile(path)
        try:
            _read_one(f, path, index, spec.scale, arch, base, out)
        finally:
            f.close()
    return out


def _read_one(f: GGUFFile, path: Path, index: int, user_scale: float, arch: str,
              base: dict[str, TensorInfo], out: dict[str, list[LoraDelta]]) -> None:
    meta = f.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise ModelLoadError(path, f"not a LoRA adapter (general.type {meta.get('general.type')!r}, "
                                   f"adapter.type {meta.get('adapter.type')!r}; want 'adapter', 'lora')")
    if meta.get("general.architecture") != arch:
        raise ModelLoadError(path, f"a LoRA adapter for {meta.get('general.architecture')!r}, "
                                   f"the model is {arch!r}")
    alpha = float(meta.get("adapter.lora.alpha", 0.0))
    names = set(f.tensors)
    for name in sorted(names):
        if name.endswith(".lora_b"):
            continue
        if not name.endswith(".lora_a"):
            raise ModelLoadError(path, f"tensor {name} is not a lora_a / lora_b pair")
        target = name[:-len(".lora_a")]
        ta, tb = f.tensors[name], f.tensors.get(target + ".lora_b")
        if tb is None:
            raise ModelLoadError(path, f"tensor {name} has no {target}.lora_b")
        w = base.get(target)
        if w is None:
            raise ModelLoadError(path, f"adapts {target}, which the model does not have "
                                       "(an adapter for another base?)")
        if target == "token_embd.weight" or len(w.shape) != 2:
            raise ModelLoadError(path, f"adapting {target} is not supported (only 2-D matmul weights)")
        if (len(ta.shape) != 2 or len(tb.shape) != 2 or ta.shape[1] != tb.shape[0]
                or ta.shape[0] != w.shape[0] or tb.shape[1] != w.shape[1]):
            raise ModelLoadError(path, f"{target}: lora_a {list(ta.shape)} / lora_b "
                                       f"{list(tb.shape)} do not fit the model's {list(w.shape)} "
                                       "(an adapter for another base?)")
        unit = alpha / tb.shape[0] if alpha else 1.0  # alpha / rank
        out.setdefault(target, []).append(LoraDelta(_floats(f, ta), _floats(f, tb),
                                                    user_scale * unit, index, unit))
    for name in names:
        if name.endswith(".lora_b") and name[:-len(".lora_b")] + ".lora_a" not in names:
            raise ModelLoadError(path, f"tensor {name} has no lora_a")


def merged(m: quants.QuantMatrix, deltas: list[LoraDelta]) -> quants.QuantMatrix:
    """m with every delta added, as a float32 matrix (float64 products, rounded once)."""
    w = quants.dequantize(m.raw, m.qtype, m.n_cols).astype(np.float64)
    for d in deltas:
        w += d.scale * (d.b.astype(np.float64) @ d.a.astype(np.float64))
    raw = np.ascontiguousarray(w.astype("<f4")).view(np.uint8)
    return quants.QuantMatrix(raw, GGMLQuantizationType.F32, m.n_rows, m.n_cols)


def adapted_tensors(specs: Sequence[LoraSpec]) -> set[str]:
    """The base tensors the adapters adapt, from their headers."""
    targets: set[str] = set()
    for spec in specs:  # the header alone: no mapping of the adapter's data
        tensors = read_header(spec.path, vocabulary=False)[1]
        targets |= {n[:-len(".lora_a")] for n in tensors if n.endswith(".lora_a")}
    return targets


def merged_bytes(targets: set[str], base: dict[str, TensorInfo]) -> int:
    """Bytes the merged float32 copies of the adapted base tensors `targets` (adapted_tensors)
    take: what a load with those adapters holds beyond the file."""
    return sum(4 * base[t].shape[0] * base[t].shape[1] for t in targets
               if t in base and len(base[t].shape) == 2)
