"""What an architecture is to the engine: its facts, declared, and its block, written once.

A family module (llama.py, qwen.py, phi3.py, gemma.py) declares an ArchSpec: the GGUF keys it
reads (engine/arch/declare.py's Key, walked by engine/hparams.py), the tensors of each layer
(Tensor / Fused, walked by engine/weights.py into the family's Layer dataclass), and its block, a
few lines against `Builder`. A llama-like family is llama's spec with one or two changes
(qwen.py, phi3.py). Both ways of running the model implement Builder: the fused task graph
(engine.builders.GraphBuilder, one node per call) and the readable eager twin
(engine.builders.EagerBuilder, numpy arrays op by op). So a family's layer exists once, and the
two paths cannot drift apart.

Builder works on the forward pass's named activation rows, all [T, ...] float32:
    x  residual stream [n_embd]        h  normed x [n_embd]        o  a sublayer's output [n_embd]
    q  queries, then the attention output [q_dim]    k, v  keys and values [kv_dim]
    g  FFN gate, then act(gate) * up [n_ff]          u  FFN up [n_ff]
A mixture of experts routes h first (route: each token's k experts and their weights, tokens
grouped by expert) and then runs the chosen experts' FFNs into o (expert_ffn).
The residual add rides on the next norm: add_norm(w) is x += o (when o holds a sublayer's
output), h = rms_norm(x) * w, so a block reads like pre-norm transformer algebra.
A family may name buffers of its own (gemma4's per-layer inputs): a projection's target
creates one as wide as the matrix's rows, and per-token inputs the family computes from the ids
(ArchSpec.token_inputs) come in as named buffers; its model-level tensors (ArchSpec.globals)
reach its prologue, which runs once before the first layer.
Widths follow the layer (HParams.layer_dims): a sliding layer's q, k and v may have another
head dim, a layer's g and u another FFN width (gemma4); the model calls begin_layer(i) first.

Adding a family that is not llama-like, e.g. a mixture of experts or a recurrent block:
  1. engine/arch/<family>.py: its Keys (llama.KEYS plus, say, expert_count: such a key lands in
     hp.extra and may be a tensor dim), its Layer dataclass and the Tensors that fill it (the
     router [n_embd, expert_count]; the stacked experts need one new tensor kind in
     engine/weights.py's walk, 3-D as llama.cpp's ffn_*_exps), its block against Builder.
  2. the Builder operations the block needs beyond these (top-k routing, a state update) with
     their kernels and numpy twins, in both engine/builders.py builders.
  3. one entry in engine/arch/__init__.py's SPECS.
Nothing in hparams.py, weights.py or servable.py names a family.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar, cast

import numpy as np

from ..formats import quants
from .declare import Declared, Key, KeyValues, declared_names

if TYPE_CHECKING:
    from ..delta_net_layer import DeltaNetDims, DeltaNetWeights
    from ..hparams import HParams
    from ..recurrent import RecurrentShape


@dataclass(kw_only=True)
class Layer:
    """One block's tensors: a family subclasses it with the fields its declaration fills
    (matrices quants.QuantMatrix, vectors float32 np.ndarray, optional ones `| None = None`)."""

    def matrices(self) -> list[quants.QuantMatrix]:
        """The layer's weight matrices, in field order (a stack's, expert by expert)."""
        out: list[quants.QuantMatrix] = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, quants.HostMatrix):
                out.append(cast(quants.QuantMatrix, v))
            elif isinstance(v, quants.StackedMatrix):
                out += v.matrices
        return out

    def with_matrices(self, prepare: Callable[[quants.QuantMatrix], Any]) -> Self:
        """A copy with every matrix replaced by prepare(it) (engine.formats.repack's layouts);
        stacked experts are with_stacks'."""
        return dataclasses.replace(self, **{
            f.name: prepare(cast(quants.QuantMatrix, v)) for f in dataclasses.fields(self)
            if isinstance(v := getattr(self, f.name), quants.HostMatrix)})

    def with_stacks(self, prepare: Callable[[quants.StackedMatrix], Any]) -> Self:
        """A copy with every stack of experts replaced by prepare(it) (repacked experts)."""
        return dataclasses.replace(self, **{
            f.name: prepare(v) for f in dataclasses.fields(self)
            if isinstance(v := getattr(self, f.name), quants.StackedMatrix)})


class Builder(Protocol):
    """The operations a block is written in (see the module docstring for the buffers)."""

    hp: HParams  # the model's hyperparameters (a family's own keys: hp.dim(name))

    def add_norm(self, weight: np.ndarray) -> None:
        """x += o (if a sublayer wrote o); h = rms_norm(x) * weight."""

    def norm(self, buf: str, weight: np.ndarray) -> None:
        """buf = rms_norm(buf) * weight, in place (gemma's post-norms of o)."""

    def project(self, src: str, targets: list[tuple[quants.QuantMatrix, str]]) -> None:
        """dst = src @ W.T for each (W, dst)."""

    def add_bias(self, buf: str, bias: np.ndarray) -> None:
        """buf += bias, per row."""

    def head_norm(self, buf: str, weight: np.ndarray) -> None:
        """Each head_dim vector of buf (q or k) = rms_norm(it) * weight."""

    def rope_store(self, layer: int) -> None:
        """rope q and k at their positions (this layer's base); k, v -> this layer's cache."""

    def rope_q(self, layer: int) -> None:
        """rope q only: a layer that reads an earlier layer's cache (HParams.kv_layer) stores
        nothing."""

    def add(self, buf: str, other: str) -> None:
        """buf += other, elementwise (other's rows as wide as buf's)."""

    def scale(self, buf: str, c: float) -> None:
        """buf *= c."""

    def add_residual(self, scale: float = 1.0) -> None:
        """x += o (if a sublayer wrote o), then x *= scale (gemma4's layer_output_scale)."""

    def scale_q(self) -> None:
        """q *= the attention scale, and the next attention scales by 1 (gemma's order: llama.cpp
        scales q before q . k, so q's f16 rounding sees the scaled values)."""

    def attention(self, layer: int, sinks: np.ndarray | None = None) -> None:
        """q = attention(q, this layer's cache): causal, its window, softcap and scale; sinks
        (float32 [n_head], a family with ArchSpec.attn_sinks): one more logit per head."""

    def glu(self, act: str, gate: str = "g", up: str = "u") -> None:
        """gate = act(gate) * up, act "silu" or "gelu_tanh"."""

    def route(self, router: quants.QuantMatrix, k: int, bias: np.ndarray | None = None,
              gating: str = "softmax") -> None:
        """Each token of h picks k experts from logits = h @ router.T (+ bias). gating "softmax":
        p = softmax(logits) over all of them, the k largest p, their weights renormalised to sum
        1 (llama.cpp's softmax gating, norm_w); "softmax_topk": the k largest logits, their
        weights the softmax over those k (SOFTMAX_WEIGHT, gpt-oss)."""

    def expert_ffn(self, gate: quants.StackedMatrix, up: quants.StackedMatrix,
                   down: quants.StackedMatrix, act: str,
                   biases: ExpertBiases | None = None) -> None:
        """o = sum over the routed experts e of weight_e * (act(h @ gate_e) * (h @ up_e)) @ down_e;
        each expert's matrices run once over all of its tokens, unchosen ones not at all. act
        "silu", "gelu_tanh" or "swiglu_oai" (act(g, u) as a whole: engine.kernels.moe_oai);
        biases: each expert's, added to its gate, up and down outputs (gpt-oss)."""

    def split_gate(self) -> None:
        """q, gate = the halves of each head's rows of qg ([q; gate] per head: Qwen3.5's
        gated attention projects both with one matrix)."""

    def apply_gate(self) -> None:
        """q *= sigmoid(gate): the attention output gated per channel."""

    def delta_net(self, layer: int, w: DeltaNetWeights, dims: DeltaNetDims) -> None:
        """o = the Gated DeltaNet sublayer of h (engine/delta_net_layer.py), each chunk reading
        and updating its slot's recurrent state (engine/recurrent.py)."""


@dataclass(frozen=True)
class ExpertBiases:
    """Per-expert biases of a mixture's matrices, float32 [n_expert, rows of that matrix]."""
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


L = TypeVar("L", bound=Layer)


@dataclass(frozen=True)
class ArchSpec(Generic[L]):
    """One family's facts (llama.cpp's): what it reads, what it holds, what it computes."""
    name: str                           # general.architecture
    keys: tuple[Key, ...]               # hyperparameters, walked in order (a later name wins)
    finish: Callable[[KeyValues], None]  # derives fields from the keys read, refuses what
    #                                      the block cannot honour
    layer: type[L]                      # one block's tensors, filled from `tensors`
    tensors: tuple[Declared, ...]       # per layer: blk.{i}.<gguf>
    block: Callable[[Builder, L, int], None]  # its layer, written against Builder
    rope_neox: bool = False             # rope pairs (i, i + n_rot/2) rather than (2i, 2i+1)
    attn_sinks: bool = False            # its attention takes per-head sinks (a kernel built so)
    bidirectional_spans: bool = False   # an embedding span's rows may see each other (gemma3)
    raw_spans: bool = False             # an embedding span's rows skip the embedding scale
    #                                     (gemma3: llama.cpp scales a batch of token ids only)
    globals: tuple[Declared, ...] = ()  # model-level tensors of the family's own (Weights.extra)
    prologue: Callable[[Builder, Mapping[str, Any]], None] | None = None  # before layer 0,
    #                                     given Weights.extra
    token_inputs: Callable[[Mapping[str, Any], HParams, np.ndarray],
                           dict[str, np.ndarray]] | None = None  # (extra, hp, ids int64 [T]) ->
    #                                     named float32 [T, width] rows the block reads
    recurrent: Callable[[HParams], RecurrentShape] | None = None  # layers with a state per
    #                                     sequence (qwen35's DeltaNet): run by the eager builder
    skips: Callable[[HParams, str], bool] | None = None  # tensors of the file it does not run
    #                                     (qwen35's multi-token-prediction draft block)
    check_layers: Callable[[HParams, list[L]], str | None] | None = None  # why the loaded
    #                                     layers do not fit (qwen35's interleave), or None
    encoder_block: Callable[[Any, L, int], None] | None = None  # an encoder's layer, written
    #                                     against engine.arch.bert.EncoderOps (bert, nomic-bert):
    #                                     such a family runs in engine.encoder, not on Builder
    positions: str = "rope"             # "learned": an encoder's absolute position_embd rows

    @property
    def is_encoder(self) -> bool:
        """Every token sees every other token of its text; embeds, never generates."""
        return self.encoder_block is not None

    def __post_init__(self) -> None:
        """The declaration and the layer type agree: every declared tensor is a field, every
        field without a default is declared required, every optional one has a default."""
        fields = {f.name: f for f in dataclasses.fields(self.layer)}
        declared = declared_names(self.tensors)
        for name, required in declared.items():
            if name not in fields:
                raise TypeError(f"{self.name}: {name} is not a field of {self.layer.__name__}")
            has_default = fields[name].default is not dataclasses.MISSING
            if not required and not has_default:
                raise TypeError(f"{self.name}: optional {name} needs a default in "
                                f"{self.layer.__name__}")
        for name, f in fields.items():
            if f.default is dataclasses.MISSING and not declared.get(name, False):
                raise TypeError(f"{self.name}: {self.layer.__name__}.{name} is not declared "
                                "as a required tensor")
