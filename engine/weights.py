"""A model's tensors from its GGUF mapping, named and shaped as its family declares them.

    per layer  spec.tensors (engine/arch/declare.py), blk.{i}.<gguf> -> spec.layer's fields
    the model  MODEL_TENSORS below, the same for every family

Every tensor the file holds must be used: one the engine does not know (a bias llama.cpp would
add, an extra norm) is refused at load rather than silently left out of the computation. A
required tensor the file lacks is named; an optional one leaves its field None. Fused tensors
(phi3's attn_qkv and [gate; up] ffn_up) are served as row ranges of the one matrix, views into
the mapping, so the block and the kernels see ordinary matrices. A 3-D tensor (a mixture of
experts' stacked ffn_*_exps) is a quants.StackedMatrix whose matrices are views too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from .arch import Layer
from .arch.declare import Declared, Fused, Tensor
from .formats import quants
from .gguf import GGUFFile, ModelLoadError, TensorInfo
from .hparams import HParams
from .lora import LoraDelta, merged

MODEL_TENSORS: tuple[Declared, ...] = (
    Tensor("token_embd", "token_embd.weight", ("n_embd", "n_vocab")),
    Tensor("output", "output.weight", ("n_embd", "n_vocab"), required=False),  # absent: tied
    Tensor("rope_freqs", "rope_freqs.weight", ("half_rot",), required=False),
    Tensor("rope_factors_long", "rope_factors_long.weight", ("half_rot",), required=False),
    Tensor("rope_factors_short", "rope_factors_short.weight", ("half_rot",), required=False),
    Tensor("output_norm", "output_norm.weight", ("n_embd",)),
)


@dataclass
class Weights:
    token_embd: quants.QuantMatrix  # [n_vocab, n_embd]
    layers: list[Layer]             # the family's layer type (hp.spec.layer), one per block
    output_norm: np.ndarray         # float32 [n_embd]
    output: quants.QuantMatrix      # [n_vocab, n_embd]; token_embd itself when tied
    #                                 (the matrices may be RepackedMatrix once a Transformer prepares them)
    rope_freqs: np.ndarray | None   # float32 [n_rot / 2] per-frequency divisors (llama 3.1,
    #                                 phi3's LongRoPE factors)
    extra: dict[str, Any] = field(default_factory=dict)  # the family's own model-level tensors
    #                                 (ArchSpec.globals), by declared name
    rank_head: RankHead | None = None  # a reranker's classifier (Qwen3-Reranker's yes/no rows)
    lora_bytes: int = 0  # float32 matrices with LoRA adapters merged in (engine.lora), held in RAM
    lora_deltas: dict[int, list[LoraDelta]] = field(default_factory=dict)  # by the merged
    #                                 matrix's data address: its adapters, for a side path
    #                                 at other scales (engine.lora_side)

    def matrices(self) -> list[quants.QuantMatrix]:
        out = [self.token_embd, self.output]
        out += [cast(quants.QuantMatrix, m) for m in self.extra.values()
                if isinstance(m, quants.HostMatrix)]
        for layer in self.layers:
            out += layer.matrices()
        return out


@dataclass(frozen=True)
class RankHead:
    """A reranker's classifier on the pooled row h (llama-graph.cpp build_pooling, RANK):
    scores = cls_out @ tanh(cls @ h + cls_b) + cls_out_b, each part only if the file has it."""
    cls: np.ndarray | None          # float32 [n_embd, n_embd]
    cls_b: np.ndarray | None        # float32 [n_embd]
    cls_out: np.ndarray | None      # float32 [n_cls_out, n_embd]
    cls_out_b: np.ndarray | None    # float32 [n_cls_out]

    @property
    def n_out(self) -> int:
        return 0 if self.cls_out is None else int(self.cls_out.shape[0])


def read_rank_head(read: _TensorReader) -> RankHead | None:
    """The classifier tensors (cls.*) as float32, or None when the file has none."""
    tensors = read.f.tensors
    found = {}
    for part, name in (("cls", "cls.weight"), ("cls_b", "cls.bias"),
                        ("cls_out", "cls.output.weight"), ("cls_out_b", "cls.output.bias")):
        t = tensors.get(name)
        if t is not None:
            if t.shape[0] != read.hp.n_embd and part in ("cls", "cls_out"):
                raise ModelLoadError(read.path, f"tensor {name} has shape {list(t.shape)}: its "
                                                f"rows must have {read.hp.n_embd} columns")
            found[part] = read.floats(name, tuple(t.shape))
    if not found:
        return None
    head = RankHead(found.get("cls"), found.get("cls_b"), found.get("cls_out"), found.get("cls_out_b"))
    return head


def row_range(m: quants.QuantMatrix, start: int, n: int) -> quants.QuantMatrix:
    """Rows [start, start + n) of m as a matrix of its own (a view, no copy)."""
    return quants.QuantMatrix(m.raw[start:start + n], m.qtype, n, m.n_cols)


class _TensorReader:
    """Reads declared tensors out of one file, remembering which ones it used."""

    def __init__(self, f: GGUFFile, hp: HParams,
                 lora: dict[str, list[LoraDelta]] | None = None) -> None:
        self.f, self.hp, self.path = f, hp, str(f.path)
        self.lora = lora or {}  # adapter deltas by base tensor name, merged as read (engine.lora)
        self.merged: dict[str, int] = {}  # merged tensor -> its float32 bytes (held besides the file)
        self.deltas: dict[int, list[LoraDelta]] = {}  # merged matrix's data address -> its deltas
        self.used: set[str] = set()

    def walk(self, declared: tuple[Declared, ...], prefix: str,
             layer: int | None = None) -> dict[str, Any]:
        """Field name -> matrix or float32 vector for each declared tensor the file holds;
        a required one it lacks is a ModelLoadError naming it. `layer`: dims are that layer's
        (HParams.layer_dims)."""
        out: dict[str, Any] = {}

        def dim(name: str) -> int:
            return self.hp.dim(name, layer)

        for t in declared:
            name = prefix + t.gguf
            if not t.required and name not in self.f.tensors:
                continue
            if isinstance(t, Fused):
                rows = [dim(r) for _, r in t.parts]
                whole = self.matrix(name, dim(t.cols), sum(rows))
                for (field, _), start, n in zip(t.parts, np.cumsum([0] + rows), rows):
                    out[field] = row_range(whole, int(start), n)
            elif t.floats:
                out[t.name] = self.floats(name, tuple(dim(d) for d in t.dims))
            elif len(t.dims) == 1:
                out[t.name] = self.vector(name, dim(t.dims[0]))
            elif len(t.dims) == 3:
                out[t.name] = self.stacked(name, *(dim(d) for d in t.dims))
            else:
                n_cols, n_rows = t.dims
                out[t.name] = self.matrix(name, dim(n_cols), dim(n_rows))
        return out

    def info(self, name: str, shape: tuple[int, ...]) -> TensorInfo:
        t = self.f.tensors.get(name)
        if t is None:
            raise ModelLoadError(self.path, f"tensor {name} is missing")
        if t.shape != shape:
            raise ModelLoadError(self.path, f"tensor {name} has shape {list(t.shape)}, the "
                                            f"hyperparameters say {list(shape)}")
        if t.qtype not in quants.SUPPORTED:
            raise ModelLoadError(self.path, f"tensor {name}: type {t.qtype.name} is not supported "
                                 f"(supported: {', '.join(sorted(q.name for q in quants.SUPPORTED))})")
        self.used.add(name)
        return t

    def matrix(self, name: str, n_cols: int, n_rows: int) -> quants.QuantMatrix:
        t = self.info(name, (n_cols, n_rows))
        raw = self.f.tensor_data(name).reshape(n_rows, -1)  # uint8 [n_rows, row_bytes]
        m = quants.QuantMatrix(raw, t.qtype, n_rows, n_cols)
        if name not in self.lora:
            return m
        m = merged(m, self.lora[name])
        self.merged[name] = m.raw.nbytes
        self.deltas[m.raw.ctypes.data] = self.lora[name]
        return m

    def stacked(self, name: str, n_cols: int, n_rows: int, n_mat: int) -> quants.StackedMatrix:
        if name in self.lora:
            raise ModelLoadError(self.path, f"a LoRA adapter for the 3-D {name} is not supported")
        t = self.info(name, (n_cols, n_rows, n_mat))
        raw = self.f.tensor_data(name).reshape(n_mat, n_rows, -1)  # uint8 [n_mat, n_rows, row_bytes]
        return quants.StackedMatrix(raw, t.qtype, n_mat, n_rows, n_cols)

    def floats(self, name: str, dims: tuple[int, ...]) -> np.ndarray:
        """float32 [dims reversed] (ggml order in): a vector, or a table of rows of dims[0]."""
        t = self.info(name, dims)
        raw = self.f.tensor_data(name).reshape(int(np.prod(dims[1:], dtype=np.int64)), -1)
        values = quants.dequantize(raw, t.qtype, dims[0]).reshape(dims[::-1])
        return np.ascontiguousarray(values, dtype=np.float32)

    def vector(self, name: str, n: int) -> np.ndarray:
        t = self.info(name, (n,))
        raw = self.f.tensor_data(name).reshape(1, -1)
        return np.ascontiguousarray(quants.dequantize(raw, t.qtype, n)[0], dtype=np.float32)


def load_weights(f: GGUFFile, hp: HParams, n_ctx: int,
                 lora: dict[str, list[LoraDelta]] | None = None) -> Weights:
    """`lora`: adapter deltas (engine.lora.read_deltas) merged into the matrices they adapt."""
    spec, read = hp.spec, _TensorReader(f, hp, lora)
    layers = [spec.layer(**read.walk(spec.tensors, f"blk.{i}.", i)) for i in range(hp.n_layer)]
    m = read.walk(MODEL_TENSORS, "")
    rope_freqs = m.get("rope_freqs")
    long, short = m.get("rope_factors_long"), m.get("rope_factors_short")
    if long is not None or short is not None:  # LongRoPE: llama.cpp's switch on the context
        rope_freqs = long if hp.n_ctx_orig and n_ctx > hp.n_ctx_orig else short
        if rope_freqs is None:
            raise ModelLoadError(read.path, "LongRoPE needs both rope_factors_long and _short")
    weights = Weights(m["token_embd"], layers, m["output_norm"], m.get("output", m["token_embd"]),
                      rope_freqs, read.walk(spec.globals, ""), read_rank_head(read))
    problem = spec.check_layers(hp, layers) if spec.check_layers is not None else None
    if problem:
        raise ModelLoadError(read.path, problem)
    check_all_used(read)
    unapplied = sorted(set(read.lora) - set(read.merged))
    if unapplied:
        raise ModelLoadError(read.path, f"a LoRA adapter adapts {unapplied[0]}, which is not a "
                                        "matmul weight here: not supported")
    weights.lora_bytes = sum(read.merged.values())
    weights.lora_deltas = read.deltas
    return weights


def check_all_used(read: _TensorReader) -> None:
    """A tensor of the file the walk did not read is refused (the engine would ignore it), but
    for those the family skips (ArchSpec.skips)."""
    f, hp, spec = read.f, read.hp, read.hp.spec
    unused = sorted(n for n in set(f.tensors) - read.used
                    if spec.skips is None or not spec.skips(hp, n))
    if unused:
        raise ModelLoadError(read.path, f"tensor {unused[0]} is not part of the engine's "
                                        f"{hp.arch} block ({len(unused)} unused tensors): not supported")
