"""The two implementations of engine.arch.Builder: the fused task graph and its eager twin.

GraphBuilder lays a block out as task nodes (engine.kernels.tasks) over fixed activation rows,
once per model and output kind; EagerBuilder computes it at once, op by op from Python, with
the same kernels. Both give the same bits, which tests/engine/test_step.py holds them to.

Producers of per-token rows (norm, quantize, bias, head norm, glu, rope, scale) split rows the
same way, so they chain without barriers; a barrier comes before anything that reads other
threads' rows (matmuls read every activation row, attention every cache row of its chunk, the
final norm's gather the last row of each chunk).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import lora_side
from .delta_net_layer import delta_net_layer
from .formats import quants
from .kernels import delta_net, kvq_tasks, moe, moe_oai, moe_tasks, ops, rotary, tasks
from .kernels.pool import Graph
from .kv_types import quantize_rows

if TYPE_CHECKING:
    from .arch.base import ExpertBiases
    from .delta_net_layer import ChunkRows, DeltaNetDims, DeltaNetWeights
    from .model import Chunk, Transformer, _Activations

_ACT_OPS = {"silu": "silu_mul", "gelu_tanh": "gelu_mul"}
_LAYER_WIDTH = {"q": "q_dim", "k": "kv_dim", "v": "kv_dim",  # widths that follow the layer
                "g": "n_ff", "u": "n_ff"}
_FIXED = frozenset({"x", "o", "h"})                           # _Activations' other rows


def _addr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


@dataclass
class _Routing:
    """route's tables for the next expert_ffn (engine.kernels.moe's shapes; P = tokens * k)."""
    k: int
    n_expert: int
    ids: np.ndarray        # int64 [T, k] each token's experts
    weights: np.ndarray    # float32 [T, k] their weights
    offsets: np.ndarray    # int64 [E + 1] expert e's run of grouped rows
    padded: np.ndarray     # int64 [E + 1] where its packed activations start, in rows
    rows: np.ndarray       # int64 [P] the token of each grouped row
    pos: np.ndarray        # int64 [T, k] the grouped row of each (token, choice)


def _route_fn(gating: str) -> int:
    """The routing kernel of a gating (engine.arch.base.Builder.route)."""
    if gating == "softmax":
        return moe.load_moe().address["moe_route"]
    if gating == "softmax_topk":
        return moe_oai.load_moe_oai().address["moe_route_topk"]
    raise ValueError(f"unknown gating {gating!r}")


class GraphBuilder:
    """Appends one forward pass's task nodes to a Graph, naming each task's arguments."""

    def __init__(self, tr: Transformer, acts: _Activations) -> None:
        self.tr, self.a, self.hp = tr, acts, tr.hp
        self.graph = Graph()
        self.task = tr.tasks.address
        self.op = tr.ops.address
        self.o_pending = False  # o holds a sublayer's output not yet added to x
        self.q_scaled = False   # q already carries the attention scale
        self.routing: _Routing  # set by route, read by the expert_ffn after it
        self.dims = self.hp.layer_dims(0)  # the widths of the layer being laid out

    def begin_layer(self, layer: int) -> None:
        """The next nodes belong to `layer`: q, k, v, g and u take its widths."""
        self.dims = self.hp.layer_dims(layer)

    def _node(self, task: str, layout: tasks.Layout, **fields: int | float) -> np.ndarray:
        args = layout.pack(**fields)
        self.graph.add(self.task[task], args)
        return args

    def _buf(self, name: str, width: int | None = None) -> np.ndarray:
        """A named activation buffer [capacity, its width]: q, k, v as wide as this layer has
        them (a view of the widest layer's rows), a family's own by name (made `width` wide
        at its first use)."""
        if name in _LAYER_WIDTH:
            full: np.ndarray = getattr(self.a, name)
            w = self.dims[_LAYER_WIDTH[name]]
            return full.reshape(-1)[:full.shape[0] * w].reshape(full.shape[0], w)
        if name in _FIXED:
            buf: np.ndarray = getattr(self.a, name)
            return buf
        return self.a.named(name, width)

    # -- Builder ---------------------------------------------------------------------------------
    def add_norm(self, weight: np.ndarray) -> None:
        a = self.a
        self.norm_rows(a.x, a.o if self.o_pending else None, weight, a.h)
        self.o_pending = False

    def norm(self, buf: str, weight: np.ndarray) -> None:
        x = self._buf(buf)
        self.norm_rows(x, None, weight, x)

    def project(self, src: str, targets: list[tuple[quants.QuantMatrix, str]]) -> None:
        s = self._buf(src)
        self.matmuls(s, s.shape[1], [(w, self._buf(dst, w.n_rows)) for w, dst in targets])
        self.o_pending = self.o_pending or any(dst == "o" for _, dst in targets)

    def add(self, buf: str, other: str) -> None:
        x = self._buf(buf)
        self._node("task_glu", tasks.GLU, fn=self.op["add"], gate=_addr(x),
                   up=_addr(self._buf(other, x.shape[1])), n=x.shape[1], m_at=tasks.M_TOKENS)

    def scale(self, buf: str, c: float) -> None:
        x = self._buf(buf)
        self._node("task_scale", tasks.SCALE, fn=self.op["scale"], x=_addr(x), n=x.shape[1],
                   c=c, m_at=tasks.M_TOKENS)

    def add_residual(self, scale: float = 1.0) -> None:
        if self.o_pending:
            self.add("x", "o")
            self.o_pending = False
        if scale != 1.0:
            self.scale("x", scale)

    def add_bias(self, buf: str, bias: np.ndarray) -> None:
        x = self._buf(buf)
        self._node("task_bias", tasks.BIAS, fn=self.op["add_bias"], x=_addr(x), bias=_addr(bias),
                   n=x.shape[1], m_at=tasks.M_TOKENS)

    def head_norm(self, buf: str, weight: np.ndarray) -> None:
        x, hd = self._buf(buf), self.dims["head_dim"]
        self._node("task_head_norm", tasks.HEAD_NORM, fn=self.op["rms_norm"], x=_addr(x),
                   weight=_addr(weight), n_head=x.shape[1] // hd, head_dim=hd, eps=self.hp.rms_eps)

    def rope_store(self, layer: int, store: bool = True) -> None:
        tr, a, hp = self.tr, self.a, self.hp
        n_rot = hp.layer_n_rot(layer)
        cos, sin = rotary.rope_tables(n_rot, tr.ropes[layer], tr.n_ctx)
        k_cache, v_cache, group = tr.cache.layer(layer)
        # rope_q: no kv heads, so the task ropes and stores no k, v
        fields = dict(rope=self.op[tr.rope_op], q=_addr(a.q), k=_addr(a.k), v=_addr(a.v),
                      n_head=hp.n_head, n_kv_head=self.dims["n_head_kv"] if store else 0,
                      head_dim=self.dims["head_dim"], half_rot=n_rot // 2, cos=_addr(cos),
                      sin=_addr(sin), n_table=cos.shape[0], k_cache=_addr(k_cache[0]),
                      v_cache=_addr(v_cache[0]), group=group)
        if tr.kv_attention is None or not store:
            self._node("task_rope_store", tasks.ROPE_STORE, **fields)
            return
        # a quantized cache: the rows stored as ggml blocks (engine.kernels.kvq_tasks)
        kvq, cache = kvq_tasks.load_kvq_tasks(), tr.cache
        self.graph.add(kvq.address["task_rope_store_quantized"], kvq_tasks.ROPE_STORE_QUANTIZED.pack(
            **fields, k_quantize=kvq.quantizer(cache.type_k.name),
            v_quantize=kvq.quantizer(cache.type_v.name), **self._kv_row_bytes()))

    def _kv_row_bytes(self) -> dict[str, int]:
        """Bytes of one position's keys and values (all kv heads) in a quantized cache."""
        cache, n_kv, hd = self.tr.cache, self.dims["n_head_kv"], self.dims["head_dim"]
        return dict(k_row_bytes=n_kv * cache.type_k.row_bytes(hd),
                    v_row_bytes=n_kv * cache.type_v.row_bytes(hd))

    def rope_q(self, layer: int) -> None:
        self.rope_store(layer, store=False)

    def scale_q(self) -> None:
        self.scale("q", self.hp.scale())
        self.q_scaled = True

    def attention(self, layer: int, sinks: np.ndarray | None = None) -> None:
        tr, a, hp = self.tr, self.a, self.hp
        k_cache, v_cache, group = tr.cache.layer(layer)
        scale, self.q_scaled = (1.0 if self.q_scaled else hp.scale()), False
        self.graph.barrier()  # every thread's cache rows and q rows (rope_store, scale_q) are in
        if tr.kv_attention is not None:  # a quantized cache: every chunk size on its one kernel
            kvq, hd = kvq_tasks.load_kvq_tasks(), self.dims["head_dim"]
            self.graph.add(kvq.address["task_attention_quantized"], kvq_tasks.ATTENTION_QUANTIZED.pack(
                fn=tr.kv_attention.address(hd), q=_addr(a.q), k_cache=_addr(k_cache[0]),
                v_cache=_addr(v_cache[0]), out=_addr(a.q), scratch=_addr(tr._scratch),
                scratch_bytes=4 * tr._scratch_stride(), n_head=hp.n_head,
                n_kv_head=self.dims["n_head_kv"], head_dim=hd, scale=scale, group=group,
                window=hp.layer_window(layer), ring=tr.cache.group(layer).ring,
                **self._kv_row_bytes()))
            self.graph.barrier()
            return
        fields = dict(f16acc=tr.attention.f16acc_address,
                      exact=tr.attention.tiled_address, q=_addr(a.q), k_cache=_addr(k_cache[0]),
                      v_cache=_addr(v_cache[0]), out=_addr(a.q), scratch=_addr(tr._scratch),
                      scratch_bytes=4 * tr._scratch_stride(), n_head=hp.n_head,
                      n_kv_head=self.dims["n_head_kv"], head_dim=self.dims["head_dim"], scale=scale,
                      group=group,
                      window=hp.layer_window(layer), ring=tr.cache.group(layer).ring,
                      softcap=hp.attn_softcap)
        bidirectional = tr.attention.bidirectional  # gemma3: its own task and kernel
        if sinks is None and not bidirectional:
            self._node("task_attention", tasks.ATTENTION, **fields)
        elif sinks is None:
            self.graph.add(tasks.attention_task(False, True), tasks.ATTENTION.pack(**fields))
        else:  # gpt-oss: the sinks' own task and kernel (engine.kernels.attention)
            self.graph.add(tasks.attention_task(True, bidirectional),
                           tasks.ATTENTION_SINKS.pack(**fields, sinks=_addr(sinks)))
        self.graph.barrier()

    def glu(self, act: str, gate: str = "g", up: str = "u") -> None:
        g = self._buf(gate)
        self.graph.barrier()
        self._node("task_glu", tasks.GLU, fn=self.op[_ACT_OPS[act]], gate=_addr(g),
                   up=_addr(self._buf(up, g.shape[1])), n=g.shape[1], m_at=tasks.M_TOKENS)

    def route(self, router: quants.QuantMatrix, k: int, bias: np.ndarray | None = None,
              gating: str = "softmax") -> None:
        a, T, E = self.a, self.a.capacity, router.n_rows
        logits = a.scratch("moe_logits", (T, E), np.float32)
        r = self.routing = _Routing(
            k, E, a.scratch("moe_ids", (T, k), np.int64), a.scratch("moe_w", (T, k), np.float32),
            a.scratch("moe_offsets", (E + 1,), np.int64), a.scratch("moe_padded", (E + 1,), np.int64),
            a.scratch("moe_rows", (T * k,), np.int64), a.scratch("moe_pos", (T, k), np.int64))
        fn = moe.load_moe().address
        self.matmuls(a.h, a.h.shape[1], [(router, logits)])         # logits = h @ router.T
        if bias is not None:
            self._node("task_bias", tasks.BIAS, fn=self.op["add_bias"], x=_addr(logits),
                       bias=_addr(bias), n=E, m_at=tasks.M_TOKENS)  # + the router bias
            self.graph.barrier()
        route_fn = _route_fn(gating)
        self._moe_node("task_moe_route", moe_tasks.ROUTE, fn=route_fn, logits=_addr(logits),
                       ids=_addr(r.ids), weights=_addr(r.weights), n_expert=E, k=k)
        self.graph.barrier()
        self._moe_node("task_moe_group", moe_tasks.GROUP, fn=fn["moe_group"], ids=_addr(r.ids),
                       n_expert=E, k=k, offsets=_addr(r.offsets), padded=_addr(r.padded),
                       rows=_addr(r.rows), pos=_addr(r.pos))
        self.graph.barrier()

    def expert_ffn(self, gate: quants.StackedMatrix, up: quants.StackedMatrix,
                   down: quants.StackedMatrix, act: str,
                   biases: ExpertBiases | None = None) -> None:
        a, r = self.a, self.routing
        P, n_ff = a.capacity * r.k, gate.n_rows
        x = a.scratch("moe_x", (P, a.h.shape[1]), np.float32)      # h rows grouped by expert
        g = a.scratch("moe_g", (P, n_ff), np.float32)
        u = a.scratch("moe_u", (P, n_ff), np.float32)
        eo = a.scratch("moe_eo", (P, down.n_rows), np.float32)      # each pair's expert output
        inputs = self._pack(a.h, x, [gate, up])                     # x = h[rows], quantized per run
        self._expert_matmul(gate, inputs, g)
        self._expert_matmul(up, inputs, u)
        self.graph.barrier()
        if biases is not None:
            self._expert_bias(g, biases.gate)
            self._expert_bias(u, biases.up)
        glu = moe_oai.load_moe_oai().address["swiglu_oai"] if act == "swiglu_oai" \
            else self.op[_ACT_OPS[act]]
        self._node("task_glu", tasks.GLU, fn=glu, gate=_addr(g), up=_addr(u),
                   n=r.k * n_ff, m_at=tasks.M_TOKENS)               # a token's k rows at once
        self.graph.barrier()
        self._expert_matmul(down, self._pack(None, g, [down]), eo)
        self.graph.barrier()
        if biases is not None:
            self._expert_bias(eo, biases.down)
        self._moe_node("task_moe_combine", moe_tasks.COMBINE, fn=moe.load_moe().address["moe_combine"],
                       eo=_addr(eo), pos=_addr(r.pos), weights=_addr(r.weights), out=_addr(a.o),
                       n=down.n_rows, k=r.k)                        # same rows as the next norm
        self.o_pending = True

    def split_gate(self) -> None:
        raise NotImplementedError("gated attention runs on the eager builder (a recurrent family)")

    def apply_gate(self) -> None:
        raise NotImplementedError("gated attention runs on the eager builder (a recurrent family)")

    def delta_net(self, layer: int, w: DeltaNetWeights, dims: DeltaNetDims) -> None:
        raise NotImplementedError("the DeltaNet runs on the eager builder (a recurrent family)")

    def _expert_bias(self, rows: np.ndarray, bias: np.ndarray) -> None:
        """Each grouped row of rows += its expert's row of bias [n_expert, n], then a barrier."""
        r = self.routing
        self.graph.add(moe_oai.load_moe_oai().address["task_moe_bias"], moe_oai.EXPERT_BIAS.pack(
            fn=self.op["add_bias"], x=_addr(rows), bias=_addr(bias), n=rows.shape[1],
            offsets=_addr(r.offsets), n_expert=r.n_expert, k=r.k))
        self.graph.barrier()

    def _moe_node(self, task: str, layout: tasks.Layout, **fields: int | float) -> None:
        self.graph.add(moe_tasks.task_addresses()[task], layout.pack(**fields))

    def _pack(self, src: np.ndarray | None, dst: np.ndarray,
              stacks: list[quants.StackedMatrix]) -> dict[str | None, tuple[int, int]]:
        """dst = src[rows] (src None: dst is filled already), then dst quantized per run for each
        activation format the stacks' kernels take. Returns act -> (input address, row bytes)."""
        a, r, n = self.a, self.routing, dst.shape[1]
        inputs: dict[str | None, tuple[int, int]] = {None: (_addr(dst), 4 * n)}
        gather = 0 if src is None else moe.load_moe().address["moe_gather"]
        for stack in stacks:
            k = self.tr.matmul_kernels.kernels_for(stack.matrix(0))
            if k.act is None or k.act in inputs:
                continue
            row_bytes = k.act_bytes(n, moe.PAD_ROWS) // moe.PAD_ROWS  # either layout's
            xq = a.scratch(f"moe_xq_{k.act}_{n}", ((dst.shape[0] + (moe.PAD_ROWS - 1) * r.n_expert)
                                                   * row_bytes,), np.uint8)
            inputs[k.act] = (_addr(xq), row_bytes)
            self._pack_node(src, dst, gather, k.quantize_address, _addr(xq), n // k.block_elems,
                            row_bytes)
            gather = 0  # the first node gathered
        if gather:
            self._pack_node(src, dst, gather, 0, 0, 0, 0)
        self.graph.barrier()
        return inputs

    def _pack_node(self, src: np.ndarray | None, dst: np.ndarray, gather: int, quantize: int,
                   xq: int, nb: int, row_bytes: int) -> None:
        r = self.routing
        self._moe_node("task_moe_pack", moe_tasks.PACK, gather=gather,
                       src=0 if src is None else _addr(src), rows=_addr(r.rows), dst=_addr(dst),
                       quantize=quantize, xq=xq, n=dst.shape[1], nb=nb, packed_row_bytes=row_bytes,
                       offsets=_addr(r.offsets), padded=_addr(r.padded), n_expert=r.n_expert, k=r.k)

    def _expert_matmul(self, w: quants.StackedMatrix, inputs: dict[str | None, tuple[int, int]],
                       out: np.ndarray) -> None:
        r, k = self.routing, self.tr.matmul_kernels.kernels_for(w.matrix(0))
        x, row_bytes = inputs[k.act]
        self._moe_node("task_moe_matmul", moe_tasks.EXPERT_MATMUL, fn=k.rows_address, w=w.address,
                       expert_bytes=w.matrix_bytes, x=x, x_row_bytes=row_bytes,
                       packed=int(k.act is not None), out=_addr(out),
                       nb=w.n_cols // k.block_elems, n_rows=w.n_rows, offsets=_addr(r.offsets),
                       padded=_addr(r.padded), n_expert=r.n_expert)

    # -- the nodes ---------------------------------------------------------------------------------
    def norm_rows(self, x: np.ndarray, residual: np.ndarray | None, weight: np.ndarray,
                  out: np.ndarray, m_at: int = tasks.M_TOKENS, gather: bool = False) -> None:
        """out = rms_norm(x += residual) * weight, per row (gather: rows STEP.out_rows).

        x and residual come from matmuls or attention, which end with a barrier, or from
        nodes with this row split (another norm): only a gather reads other threads' rows."""
        if gather:
            self.graph.barrier()
        self._node("task_norm", tasks.NORM, fn=self.op["rms_norm"], x=_addr(x),
                   residual=0 if residual is None else _addr(residual), weight=_addr(weight),
                   out=_addr(out), n=x.shape[1], eps=self.hp.rms_eps, m_at=m_at,
                   gather=int(gather))

    def matmuls(self, src: np.ndarray, n_cols: int,
                targets: list[tuple[quants.QuantMatrix, np.ndarray | None]],
                m_at: int = tasks.M_TOKENS) -> list[np.ndarray]:
        """out = src @ W.T for each (W, out): quantize src once per block format (same row split
        as src's producer, so no barrier), then the matmuls split by weight rows. Returns the
        matmul args (an `out` of None is set per call through them)."""
        mk = self.tr.matmul_kernels
        quantized: dict[str | None, int] = {None: _addr(src)}
        for w, _ in targets:
            k = mk.kernels_for(w)
            if k.act is not None and k.act not in quantized:  # None: float weights read src
                xq = self.a.xq[k.act]
                quantized[k.act] = _addr(xq)
                self._node("task_quant", tasks.QUANT, fn=k.quantize_address, src=_addr(src),
                           dst=_addr(xq), nb=n_cols // k.block_elems, m_at=m_at)
        self.graph.barrier()
        out_args = []
        for w, out in targets:
            k = mk.kernels_for(w)
            nb = w.n_cols // k.block_elems  # float types: block_elems 1, nb = K
            out_args.append(self._node(
                "task_matmul", tasks.MATMUL, fn=k.rows_address, w=w.address,
                x=quantized[k.act], out=0 if out is None else _addr(out), nb=nb,
                n_rows=w.n_rows, m_at=m_at))
        self.graph.barrier()
        return out_args


class EagerBuilder:
    """The same block computed at once: numpy arrays, one kernel call per operation."""

    def __init__(self, tr: Transformer, x: np.ndarray, chunks: list[Chunk],
                 spans: list[tuple[int, int]], positions: np.ndarray,
                 bidirectional: np.ndarray) -> None:
        self.tr, self.hp = tr, tr.hp
        self.mm = tr.matmul_kernels.matmul
        self.chunks, self.spans, self.positions = chunks, spans, positions
        self.bidirectional = bidirectional  # int64 [C, 2]: each chunk's rows that see each other
        self.bufs: dict[str, np.ndarray] = {"x": x}
        self.o_pending = False
        self.q_scaled = False
        self.routing: _Routing  # set by route, read by the expert_ffn after it
        self.recurrent_chunks: list[ChunkRows] = []  # a recurrent family's (Transformer sets)
        self.dims = self.hp.layer_dims(0)
        self.lora_rows: np.ndarray | None = None  # float32 [T, n_adapters]: engine.lora_side

    def adapted(self, w: quants.QuantMatrix, x: np.ndarray,
                rows: np.ndarray | None = None) -> np.ndarray:
        """x @ w.T, plus the LoRA side path of the rows asking other adapter scales than the
        merged ones (engine.lora_side); `rows`: which of the batch's rows x holds (default all)."""
        y = self.mm(w, x)
        if self.lora_rows is not None:
            deltas = self.tr.weights.lora_deltas.get(_data_address(w))
            if deltas:
                offs = self.lora_rows if rows is None else self.lora_rows[rows]
                lora_side.add_side_path(y, x, deltas, offs)
        return y

    def begin_layer(self, layer: int) -> None:
        self.dims = self.hp.layer_dims(layer)

    def add_norm(self, weight: np.ndarray) -> None:
        x = self.bufs["x"]
        if self.o_pending:
            x += self.bufs["o"]
            self.o_pending = False
        self.bufs["h"] = ops.rms_norm(x, weight, self.hp.rms_eps)

    def norm(self, buf: str, weight: np.ndarray) -> None:
        self.bufs[buf] = ops.rms_norm(self.bufs[buf], weight, self.hp.rms_eps)

    def project(self, src: str, targets: list[tuple[quants.QuantMatrix, str]]) -> None:
        for w, dst in targets:
            self.bufs[dst] = self.adapted(w, self.bufs[src])
        self.o_pending = self.o_pending or any(dst == "o" for _, dst in targets)

    def add_bias(self, buf: str, bias: np.ndarray) -> None:
        ops.add_bias(self.bufs[buf], bias, out=self.bufs[buf])

    def add(self, buf: str, other: str) -> None:
        ops.add(self.bufs[buf], self.bufs[other], out=self.bufs[buf])

    def scale(self, buf: str, c: float) -> None:
        ops.scale(self.bufs[buf], c, out=self.bufs[buf])

    def add_residual(self, scale: float = 1.0) -> None:
        if self.o_pending:
            self.add("x", "o")
            self.o_pending = False
        if scale != 1.0:
            self.scale("x", scale)

    def head_norm(self, buf: str, weight: np.ndarray) -> None:
        x = self.bufs[buf]
        T, hd = x.shape[0], self.dims["head_dim"]
        self.bufs[buf] = ops.rms_norm(x.reshape(T, -1, hd), weight, self.hp.rms_eps).reshape(T, -1)

    def rope_store(self, layer: int, store: bool = True) -> None:
        hp, tr, T = self.hp, self.tr, self.positions.shape[0]
        neox, hd, n_kv = tr.rope_op == "rope_neox", self.dims["head_dim"], self.dims["n_head_kv"]
        for name, heads in (("q", hp.n_head), ("k", n_kv))[:2 if store else 1]:
            x = self.bufs[name].reshape(T, heads, hd)
            self.bufs[name] = rotary.rope(x, self.positions, hp.layer_n_rot(layer),
                                       tr.ropes[layer], neox=neox).reshape(T, -1)
        if not store:
            return
        k_cache, v_cache, _ = tr.cache.layer(layer)                     # [slot, rows, n_kv, hd]
        group = tr.cache.group(layer)
        k = self.bufs["k"].reshape(T, n_kv, hd)
        v = self.bufs["v"].reshape(T, n_kv, hd)
        if tr.kv_attention is not None:  # a quantized cache: its rows as ggml blocks
            k, v = quantize_rows(k, tr.cache.type_k), quantize_rows(v, tr.cache.type_v)
        for c, (a, b) in zip(self.chunks, self.spans):
            rows = self.positions[a:b] % group.ring
            k_cache[c.slot, rows] = k[a:b]
            v_cache[c.slot, rows] = v[a:b]
            if group.is_ring:  # the ring's mirror of its first rows (engine.kv)
                mirrored = rows < group.mirror
                k_cache[c.slot, rows[mirrored] + group.ring] = k[a:b][mirrored]
                v_cache[c.slot, rows[mirrored] + group.ring] = v[a:b][mirrored]

    def rope_q(self, layer: int) -> None:
        self.rope_store(layer, store=False)

    def scale_q(self) -> None:
        ops.scale(self.bufs["q"], self.hp.scale(), out=self.bufs["q"])
        self.q_scaled = True

    def attention(self, layer: int, sinks: np.ndarray | None = None) -> None:
        hp, tr, T = self.hp, self.tr, self.positions.shape[0]
        k_cache, v_cache, _ = tr.cache.layer(layer)
        ring = tr.cache.group(layer).ring
        scale, self.q_scaled = (1.0 if self.q_scaled else hp.scale()), False
        q = self.bufs["q"].reshape(T, hp.n_head, self.dims["head_dim"])
        out = np.empty_like(q)
        for ci, (c, (a, b)) in enumerate(zip(self.chunks, self.spans)):
            if tr.kv_attention is not None:
                out[a:b] = tr.kv_attention(np.ascontiguousarray(q[a:b]), k_cache[c.slot],
                                           v_cache[c.slot], c.pos0, scale=scale,
                                           window=hp.layer_window(layer), ring=ring)
                continue
            bi = self.bidirectional[ci]
            tr.attention(q[a:b], k_cache[c.slot], v_cache[c.slot], c.pos0, out=out[a:b],
                         scale=scale, window=hp.layer_window(layer), ring=ring,
                         softcap=hp.attn_softcap, sinks=sinks,
                         bidirectional=(int(bi[0]), int(bi[1])) if tr.attention.bidirectional else None)
        self.bufs["q"] = out.reshape(T, -1)

    def glu(self, act: str, gate: str = "g", up: str = "u") -> None:
        fn = ops.silu_mul if act == "silu" else ops.gelu_mul
        self.bufs[gate] = fn(self.bufs[gate], self.bufs[up])

    def route(self, router: quants.QuantMatrix, k: int, bias: np.ndarray | None = None,
              gating: str = "softmax") -> None:
        logits = self.adapted(router, self.bufs["h"])             # [T, n_expert]
        if bias is not None:
            ops.add_bias(logits, bias, out=logits)
        ids, weights = (moe_oai.route_topk if gating == "softmax_topk" else moe.route)(logits, k)
        self.routing = _Routing(k, router.n_rows, ids, weights, *moe.group(ids, router.n_rows))

    def expert_ffn(self, gate: quants.StackedMatrix, up: quants.StackedMatrix,
                   down: quants.StackedMatrix, act: str,
                   biases: ExpertBiases | None = None) -> None:
        h, r = self.bufs["h"], self.routing
        eo = np.empty((r.rows.size, down.n_rows), np.float32)     # each pair's expert output
        glu = {"silu": ops.silu_mul, "gelu_tanh": ops.gelu_mul, "swiglu_oai": moe_oai.swiglu_oai}[act]

        def biased(y: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
            return y if bias is None else ops.add_bias(y, bias, out=y)

        for e in range(r.n_expert):
            a, b = int(r.offsets[e]), int(r.offsets[e + 1])
            if a == b:
                continue                                          # nobody chose e: not read
            x = moe.gather(h, r.rows[a:b])                        # e's tokens, [M_e, n_embd]
            g = biased(self.mm(gate.matrix(e), x), None if biases is None else biases.gate[e])
            u = biased(self.mm(up.matrix(e), x), None if biases is None else biases.up[e])
            eo[a:b] = biased(self.mm(down.matrix(e), glu(g, u)),
                             None if biases is None else biases.down[e])
        self.bufs["o"] = moe.combine(eo, r.pos, r.weights)
        self.o_pending = True

    def split_gate(self) -> None:
        qg = self.bufs["qg"]
        heads = qg.reshape(qg.shape[0], self.hp.n_head, 2, self.hp.head_dim)
        self.bufs["q"] = np.ascontiguousarray(heads[:, :, 0]).reshape(qg.shape[0], -1)
        self.bufs["gate"] = np.ascontiguousarray(heads[:, :, 1]).reshape(qg.shape[0], -1)

    def apply_gate(self) -> None:
        self.bufs["q"] = self.bufs["q"] * delta_net.sigmoid(self.bufs["gate"])

    def delta_net(self, layer: int, w: DeltaNetWeights, dims: DeltaNetDims) -> None:
        state = self.tr.cache.recurrent
        assert state is not None  # a recurrent family's cache holds one
        dims = dataclasses.replace(dims, threads=self.tr.pool.n_threads)  # the model's cores
        self.bufs["o"] = delta_net_layer(self.mm, self.bufs["h"], w, dims, state, layer,
                                         self.recurrent_chunks)
        self.o_pending = True

    def residual(self) -> np.ndarray:
        """x with the last sublayer's output added."""
        if self.o_pending:
            self.bufs["x"] += self.bufs["o"]
            self.o_pending = False
        return self.bufs["x"]


def _data_address(w: quants.QuantMatrix) -> int:
    """The address of a matrix's file-layout data (a repacked copy's source), as
    Weights.lora_deltas keys it."""
    source = getattr(w, "source", w)
    return int(source.raw.ctypes.data)
