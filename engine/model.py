"""The llama-family transformer: weights from a GGUF mapping, a KV cache, and the forward pass.

The forward pass reads like the paper and calls only ops: quantized matmuls and attention run in
compiled kernels (engine.kernels), the small per-token glue in engine.kernels.ops.

    x = embed(tokens)                                   # [T, n_embd]
    for each layer:
        h = rms_norm(x) * attn_norm
        q, k, v = h @ Wq, h @ Wk, h @ Wv; rope(q, k)     # [T, n_head|n_head_kv, head_dim]
        k, v -> KV cache (f16) at their positions
        x += attention(q, K cache, V cache) @ Wo         # causal, grouped-query
        h = rms_norm(x) * ffn_norm
        x += (silu(h @ Wgate) * (h @ Wup)) @ Wdown
    logits = rms_norm(x) * output_norm @ Woutput        # [T, n_vocab]

Several sequences can be evaluated in one call (the server batches requests): their tokens share
every matmul, so the weights are read once per step; attention runs per sequence over its slot.

How it runs: at the first call the pass above is laid out once as a graph of compiled tasks
(_build_graph, one node per step of the formula, pointing at fixed scratch buffers and at the
weights), and every call runs that whole graph on the native worker pool in one dispatch, all
threads together with barriers between dependent steps (engine.kernels.pool, .tasks); how many
threads a run uses is the governor's pick from measured run times (engine.kernels.governor). So the
Python work per call is constant, not per layer: embed the tokens, fill the STEP block
(positions, cache rows, the chunk table, the attention split), start the graph.
`forward_eager` runs the same kernels op by op from Python; both give the same bits.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import quants
from .gguf import GGUFFile, ModelLoadError
from .hparams import HParams
from .kernels import ops, tasks
from .kernels.attention import AttentionKernel, exact_scratch_floats, f16acc_scratch_floats
from .kernels.matmul import MatmulKernels
from .kernels.governor import ThreadGovernor
from .kernels.pool import Graph, Pool


def pooled_embedding(hidden: np.ndarray) -> np.ndarray:
    """[n_tokens, n_embd] final normed hidden states -> float32 [n_embd]: their mean, L2-normalised."""
    v = hidden.mean(axis=0)
    return (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)


class ContextOverflowError(ValueError):
    """More tokens than a sequence's context holds."""

    def __init__(self, n_tokens: int, n_ctx: int) -> None:
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx
        super().__init__(f"{n_tokens} tokens do not fit in a context of {n_ctx}")


@dataclass
class LayerWeights:
    attn_norm: np.ndarray          # float32 [n_embd]
    wq: quants.QuantMatrix         # [q_dim rows, n_embd cols]
    wk: quants.QuantMatrix         # [kv_dim, n_embd]
    wv: quants.QuantMatrix         # [kv_dim, n_embd]
    wo: quants.QuantMatrix         # [n_embd, q_dim]
    ffn_norm: np.ndarray           # float32 [n_embd]
    w_gate: quants.QuantMatrix     # [n_ff, n_embd]
    w_up: quants.QuantMatrix       # [n_ff, n_embd]
    w_down: quants.QuantMatrix     # [n_embd, n_ff]


@dataclass
class Weights:
    token_embd: quants.QuantMatrix  # [n_vocab, n_embd]
    layers: list[LayerWeights]
    output_norm: np.ndarray         # float32 [n_embd]
    output: quants.QuantMatrix      # [n_vocab, n_embd]; token_embd itself when tied
    rope_freqs: np.ndarray | None   # float32 [n_rot / 2] per-frequency divisors (llama 3.1)

    def matrices(self) -> list[quants.QuantMatrix]:
        out = [self.token_embd, self.output]
        for layer in self.layers:
            out += [layer.wq, layer.wk, layer.wv, layer.wo, layer.w_gate, layer.w_up, layer.w_down]
        return out


def _load_weights(f: GGUFFile, hp: HParams) -> Weights:
    path = str(f.path)

    def info(name: str, shape: tuple[int, ...]):
        t = f.tensors.get(name)
        if t is None:
            raise ModelLoadError(path, f"tensor {name} is missing")
        if t.shape != shape:
            raise ModelLoadError(path, f"tensor {name} has shape {list(t.shape)}, the "
                                       f"hyperparameters say {list(shape)}")
        if t.qtype not in quants.SUPPORTED:
            raise ModelLoadError(path, f"tensor {name}: type {t.qtype.name} is not supported "
                                       f"(supported: {', '.join(sorted(q.name for q in quants.SUPPORTED))})")
        return t

    def matrix(name: str, n_cols: int, n_rows: int) -> quants.QuantMatrix:
        t = info(name, (n_cols, n_rows))
        raw = f.tensor_data(name).reshape(n_rows, -1)  # uint8 [n_rows, row_bytes]
        return quants.QuantMatrix(raw, t.qtype, n_rows, n_cols)

    def vector(name: str, n: int) -> np.ndarray:
        t = info(name, (n,))
        raw = f.tensor_data(name).reshape(1, -1)
        return np.ascontiguousarray(quants.dequantize(raw, t.qtype, n)[0], dtype=np.float32)

    E, F = hp.n_embd, hp.n_ff
    layers = []
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=vector(p + "attn_norm.weight", E),
            wq=matrix(p + "attn_q.weight", E, hp.q_dim),
            wk=matrix(p + "attn_k.weight", E, hp.kv_dim),
            wv=matrix(p + "attn_v.weight", E, hp.kv_dim),
            wo=matrix(p + "attn_output.weight", hp.q_dim, E),
            ffn_norm=vector(p + "ffn_norm.weight", E),
            w_gate=matrix(p + "ffn_gate.weight", E, F),
            w_up=matrix(p + "ffn_up.weight", E, F),
            w_down=matrix(p + "ffn_down.weight", F, E),
        ))
    token_embd = matrix("token_embd.weight", E, hp.n_vocab)
    output = matrix("output.weight", E, hp.n_vocab) if "output.weight" in f.tensors else token_embd
    rope_freqs = vector("rope_freqs.weight", hp.n_rot // 2) if "rope_freqs.weight" in f.tensors else None
    return Weights(token_embd, layers, vector("output_norm.weight", E), output, rope_freqs)


class KVCache:
    """f16 keys and values for `n_slots` independent sequences of up to `n_ctx` tokens each.

    Allocated zeroed, so the kernel hands out pages lazily: memory is committed as it is used.
    `tokens[slot]` is what the slot holds, so a request that continues it can skip the prefix.
    """

    def __init__(self, hp: HParams, n_slots: int, n_ctx: int) -> None:
        shape = (n_slots, hp.n_layer, n_ctx, hp.n_head_kv, hp.head_dim)
        self.k = np.zeros(shape, dtype=np.float16)   # [slot, layer, pos, kv_head, head_dim]
        self.v = np.zeros(shape, dtype=np.float16)
        self.n_ctx = n_ctx
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Give slot `dst` the first `n` cached tokens of slot `src` (shared prompts, n > 1)."""
        self.k[dst, :, :n] = self.k[src, :, :n]
        self.v[dst, :, :n] = self.v[src, :, :n]
        self.tokens[dst] = self.tokens[src][:n]


@dataclass
class Chunk:
    """Tokens for one slot, appended at position `len(cache.tokens[slot])` after truncating to pos0."""
    slot: int
    tokens: list[int]
    pos0: int


class _Activations:
    """Scratch rows for up to `capacity` tokens of one forward call (f32 unless said)."""

    def __init__(self, hp: HParams, capacity: int, xq_bytes: dict[str, int]) -> None:
        self.capacity = capacity
        T, E, F = capacity, hp.n_embd, hp.n_ff
        self.x = np.empty((T, E), np.float32)            # residual stream
        self.o = np.empty((T, E), np.float32)            # last block's output, added to x next
        self.h = np.empty((T, E), np.float32)            # normed x
        self.q = np.empty((T, hp.q_dim), np.float32)     # queries, then attention output in place
        self.k = np.empty((T, hp.kv_dim), np.float32)
        self.v = np.empty((T, hp.kv_dim), np.float32)
        self.g = np.empty((T, F), np.float32)            # gate, then silu(gate) * up in place
        self.u = np.empty((T, F), np.float32)            # up
        # activations quantized for the matmuls, one buffer per block format (quants.pack_activations)
        self.xq = {act: quants.empty_packed(n) for act, n in xq_bytes.items()}


def _addr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


class Transformer:
    """Weights + kernels + KV cache; evaluates batches of chunks. Not thread-safe: one caller.

    `forward` runs the whole pass as one graph of compiled tasks on the native pool (see
    engine.kernels.pool and engine.kernels.tasks): per call, Python only embeds the tokens,
    fills the STEP block (positions, cache rows, chunk table, attention split) and starts the
    graph. `forward_eager` is the same computation op by op from Python, kept as the fused
    path's readable twin: both give the same bits.
    """

    def __init__(self, f: GGUFFile, hp: HParams, n_ctx: int, n_slots: int, n_threads: int) -> None:
        self.hp = hp
        self.n_ctx = n_ctx
        self.weights = _load_weights(f, hp)
        self.pool = Pool(n_threads)
        self.governor = ThreadGovernor(n_threads)  # how many of them each run uses
        try:
            qtypes = {m.qtype for m in self.weights.matrices()}
            self.matmul_kernels = MatmulKernels(qtypes, pool=self.pool)
            self.attention = AttentionKernel(pool=self.pool)
            self.tasks = tasks.load_tasks(self.attention.f16c)
            self.ops = ops.load_ops()
            self.cache = KVCache(hp, n_slots, n_ctx)
        except BaseException:
            self.pool.close()
            raise
        factors = self.weights.rope_freqs
        self.rope = ops.RopeSpec(hp.rope_base, hp.rope_freq_scale,
                                 None if factors is None else tuple(float(f) for f in factors))
        self._acts: _Activations | None = None
        self._graphs: dict[str, tuple[Graph, np.ndarray | None]] = {}
        self._step = np.zeros(len(tasks.STEP.fields), np.int64)  # the STEP block, fixed address
        self._step_arrays: tuple[np.ndarray, ...] = ()  # what STEP points into (kept alive)
        self._scratch = np.empty(0, np.float32)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        te = self.weights.token_embd
        return quants.dequantize(te.raw[tokens], te.qtype, te.n_cols)  # [T, n_embd]

    def _check(self, chunks: list[Chunk]) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Validate the chunks; returns (token ids int64 [T], per-chunk row spans [a, b))."""
        hp, cache = self.hp, self.cache
        if not chunks:
            raise ValueError("no chunks to evaluate")
        spans = []
        start = 0
        for c in chunks:
            if not c.tokens:
                raise ValueError("empty chunk")
            if not 0 <= c.slot < len(cache.tokens):
                raise ValueError(f"slot {c.slot} does not exist (0..{len(cache.tokens) - 1})")
            end_pos = c.pos0 + len(c.tokens)
            if end_pos > cache.n_ctx:
                raise ContextOverflowError(end_pos, cache.n_ctx)
            if not 0 <= c.pos0 <= len(cache.tokens[c.slot]):
                raise ValueError(f"slot {c.slot} holds {len(cache.tokens[c.slot])} tokens; "
                                 f"cannot append at {c.pos0}")
            spans.append((start, start + len(c.tokens)))
            start += len(c.tokens)
        if len({c.slot for c in chunks}) != len(chunks):
            raise ValueError("two chunks for the same slot in one call")
        tokens = np.fromiter((t for c in chunks for t in c.tokens), dtype=np.int64, count=start)
        bad = (tokens < 0) | (tokens >= hp.n_vocab)
        if bad.any():
            raise ValueError(f"token id {int(tokens[bad][0])} is outside the vocabulary "
                             f"(0..{hp.n_vocab - 1})")
        return tokens, spans

    # -- the fused path --------------------------------------------------------------------------
    def forward(self, chunks: list[Chunk], output: str = "last") -> list[np.ndarray]:
        """Run all chunks through the model; per chunk return logits (`last`: [n_vocab], `all`:
        [n, n_vocab]) or the final normed hidden states (`hidden`: [n, n_embd])."""
        if output not in ("last", "all", "hidden"):
            raise ValueError(f"unknown output kind {output!r}")
        tokens, spans = self._check(chunks)
        T = tokens.shape[0]
        acts = self._activations_for(T)
        graph, out_args = self._graph(output)
        acts.x[:T] = self.embed(tokens)

        L, n_ctx = self.hp.n_layer, self.n_ctx
        positions = np.concatenate([np.arange(c.pos0, c.pos0 + len(c.tokens), dtype=np.int64)
                                    for c in chunks])                              # [T]
        slot_rows = np.repeat(np.array([c.slot * L * n_ctx for c in chunks], np.int64),
                              [b - a for a, b in spans])                           # [T]
        kv_rows = positions + slot_rows                                            # [T]
        chunk_table = np.array([[a, b - a, c.pos0, c.slot * L * n_ctx]
                                for c, (a, b) in zip(chunks, spans)], np.int64)   # [C, 4]
        kind = self.governor.kind(output, T)
        threads = self.governor.choose(kind)
        seg_start, segs = tasks.split_attention([(b - a, c.pos0) for c, (a, b) in zip(chunks, spans)],
                                                self.hp.n_head, threads)
        out_rows = np.array([b - 1 for _, b in spans], np.int64)                   # [C]
        n_out = len(chunks) if output == "last" else T
        result = None
        if out_args is not None:
            result = np.empty((n_out, self.hp.n_vocab), np.float32)                # logits
            tasks.MATMUL.fill(out_args, out=_addr(result))
        tasks.STEP.fill(self._step, n_tokens=T, n_out=n_out, positions=_addr(positions),
                        kv_rows=_addr(kv_rows), chunks=_addr(chunk_table),
                        seg_start=_addr(seg_start), segs=_addr(segs), out_rows=_addr(out_rows))
        self._step_arrays = (positions, kv_rows, chunk_table, seg_start, segs, out_rows)
        started = time.perf_counter()
        self.pool.run(graph, _addr(self._step), threads)
        self.governor.record(kind, threads, time.perf_counter() - started)

        for c in chunks:
            self.cache.tokens[c.slot] = self.cache.tokens[c.slot][:c.pos0] + list(c.tokens)
        if output == "hidden":
            return [acts.h[a:b].copy() for a, b in spans]
        assert result is not None
        if output == "last":
            return [result[i] for i in range(len(chunks))]
        return [result[a:b] for a, b in spans]

    def _activations_for(self, n_tokens: int) -> _Activations:
        """Scratch for n_tokens, grown by doubling (graphs point into it, so they are rebuilt)."""
        if self._acts is None or self._acts.capacity < n_tokens:
            old = self._acts.capacity if self._acts is not None else 4
            capacity = max(n_tokens, 2 * old)
            xq_bytes: dict[str, int] = {}
            for m in self.weights.matrices():
                k = self.matmul_kernels.kernels(m.qtype)
                if k.act is not None:
                    xq_bytes[k.act] = max(xq_bytes.get(k.act, 0), k.act_bytes(m.n_cols, capacity))
            self._acts = None  # free the old buffers before taking new ones
            self._graphs.clear()
            self._acts = _Activations(self.hp, capacity, xq_bytes)
        return self._acts

    def _graph(self, output: str) -> tuple[Graph, np.ndarray | None]:
        g = self._graphs.get(output)
        if g is None:
            g = self._graphs[output] = self._build_graph(output)
        return g

    def _build_graph(self, output: str) -> tuple[Graph, np.ndarray | None]:
        """The whole forward pass as task nodes, reading like the module docstring.

        Producers of per-token rows (norm, quantize, silu, rope) split rows the same way, so they
        chain without barriers; a barrier comes before anything that reads other threads' rows
        (matmuls read every activation row, attention every cache row of its chunk).
        """
        hp, w, a = self.hp, self.weights, self._acts
        assert a is not None
        E, F = hp.n_embd, hp.n_ff
        b = _GraphBuilder(self, a)
        if self._scratch.size < self.pool.n_threads * self._scratch_stride():
            self._scratch = np.empty(self.pool.n_threads * self._scratch_stride(), np.float32)
        for li, layer in enumerate(w.layers):
            b.norm(a.x, None if li == 0 else a.o, layer.attn_norm, a.h)        # h = rms_norm(x += o)
            b.project(a.h, E, [(layer.wq, a.q), (layer.wk, a.k), (layer.wv, a.v)])  # q, k, v = h @ W
            b.rope_store(li)                                                   # rope q, k; k, v -> cache
            b.attention(li)                                                    # q = attention(q, cache)
            b.project(a.q, hp.q_dim, [(layer.wo, a.o)])                        # o = q @ Wo
            b.norm(a.x, a.o, layer.ffn_norm, a.h)                              # h = rms_norm(x += o)
            b.project(a.h, E, [(layer.w_gate, a.g), (layer.w_up, a.u)])        # g, u = h @ Wgate, h @ Wup
            b.silu(a.g, a.u, F)                                                # g = silu(g) * u
            b.project(a.g, F, [(layer.w_down, a.o)])                           # o = g @ Wdown
        if output == "hidden":
            b.norm(a.x, a.o, w.output_norm, a.h)                               # h = rms_norm(x += o)
            return b.graph, None
        m_at = tasks.M_OUT if output == "last" else tasks.M_TOKENS
        b.norm(a.x, a.o, w.output_norm, a.h, m_at=m_at, gather=output == "last")
        out_args = b.project(a.h, E, [(w.output, None)], m_at=m_at)[0]        # logits = h @ Woutput
        return b.graph, out_args

    def _scratch_stride(self) -> int:
        """Floats of attention scratch per thread: a scores row (exact path) or the f16 q rows of
        the heads the f16acc path runs together."""
        hp = self.hp
        return max(exact_scratch_floats(self.n_ctx),
                   f16acc_scratch_floats(hp.n_head, hp.n_head_kv, hp.head_dim))

    # -- the eager twin --------------------------------------------------------------------------
    def forward_eager(self, chunks: list[Chunk], output: str = "last") -> list[np.ndarray]:
        """`forward` op by op from Python (the same kernels, the same bits)."""
        if output not in ("last", "all", "hidden"):
            raise ValueError(f"unknown output kind {output!r}")
        hp, cache, mm = self.hp, self.cache, self.matmul_kernels.matmul
        tokens, spans = self._check(chunks)
        positions = np.concatenate([np.arange(c.pos0, c.pos0 + len(c.tokens)) for c in chunks])
        T = tokens.shape[0]

        x = self.embed(tokens)                                             # [T, n_embd]
        for li, layer in enumerate(self.weights.layers):
            h = ops.rms_norm(x, layer.attn_norm, hp.rms_eps)               # [T, n_embd]
            q = mm(layer.wq, h).reshape(T, hp.n_head, hp.head_dim)
            k = mm(layer.wk, h).reshape(T, hp.n_head_kv, hp.head_dim)
            v = mm(layer.wv, h).reshape(T, hp.n_head_kv, hp.head_dim)
            q = ops.rope(q, positions, hp.n_rot, self.rope)
            k = ops.rope(k, positions, hp.n_rot, self.rope)
            attn = np.empty((T, hp.n_head, hp.head_dim), dtype=np.float32)
            for c, (a, b) in zip(chunks, spans):
                kc, vc = cache.k[c.slot, li], cache.v[c.slot, li]          # [n_ctx, n_kv, hd]
                kc[c.pos0:c.pos0 + b - a] = k[a:b]
                vc[c.pos0:c.pos0 + b - a] = v[a:b]
                self.attention(q[a:b], kc, vc, c.pos0, out=attn[a:b])
            x += mm(layer.wo, attn.reshape(T, hp.q_dim))
            h = ops.rms_norm(x, layer.ffn_norm, hp.rms_eps)
            g = ops.silu_mul(mm(layer.w_gate, h), mm(layer.w_up, h))      # [T, n_ff]
            x += mm(layer.w_down, g)
        for c in chunks:
            cache.tokens[c.slot] = cache.tokens[c.slot][:c.pos0] + list(c.tokens)

        if output == "hidden":
            hn = ops.rms_norm(x, self.weights.output_norm, hp.rms_eps)
            return [hn[a:b] for a, b in spans]
        if output == "last":
            rows = np.array([b - 1 for _, b in spans])
            hn = ops.rms_norm(np.ascontiguousarray(x[rows]), self.weights.output_norm, hp.rms_eps)
            logits = mm(self.weights.output, hn)                            # [n_chunks, n_vocab]
            return [logits[i] for i in range(len(chunks))]
        hn = ops.rms_norm(x, self.weights.output_norm, hp.rms_eps)
        logits = mm(self.weights.output, hn)                                # [T, n_vocab]
        return [logits[a:b] for a, b in spans]

    def close(self) -> None:
        """Stop the pool's threads and drop the weights, cache and scratch."""
        if self.pool is not None:
            self.matmul_kernels.close()
            self.attention.close()
            self.pool.close()
            self.pool = None  # type: ignore[assignment]
        self._graphs.clear()
        self._acts = None
        self.weights = None  # type: ignore[assignment]
        self.cache = None  # type: ignore[assignment]


class _GraphBuilder:
    """Appends one forward pass's task nodes to a Graph, naming each task's arguments."""

    def __init__(self, tr: Transformer, acts: _Activations) -> None:
        self.tr, self.a = tr, acts
        self.graph = Graph()
        self.task = tr.tasks.address
        self.op = tr.ops.address

    def _node(self, task: str, layout: tasks.Layout, **fields: int | float) -> np.ndarray:
        args = layout.pack(**fields)
        self.graph.add(self.task[task], args)
        return args

    def norm(self, x: np.ndarray, residual: np.ndarray | None, weight: np.ndarray,
             out: np.ndarray, m_at: int = tasks.M_TOKENS, gather: bool = False) -> None:
        """out = rms_norm(x += residual) * weight, per row (gather: rows STEP.out_rows)."""
        self.graph.barrier()  # x and residual rows may come from any thread (matmul outputs)
        self._node("task_norm", tasks.NORM, fn=self.op["rms_norm"], x=_addr(x),
                   residual=0 if residual is None else _addr(residual), weight=_addr(weight),
                   out=_addr(out), n=x.shape[1], eps=self.tr.hp.rms_eps, m_at=m_at,
                   gather=int(gather))

    def silu(self, gate: np.ndarray, up: np.ndarray, n: int) -> None:
        """gate = silu(gate) * up, per row."""
        self.graph.barrier()
        self._node("task_silu", tasks.SILU, fn=self.op["silu_mul"], gate=_addr(gate),
                   up=_addr(up), n=n, m_at=tasks.M_TOKENS)

    def project(self, src: np.ndarray, n_cols: int,
                targets: list[tuple[quants.QuantMatrix, np.ndarray | None]],
                m_at: int = tasks.M_TOKENS) -> list[np.ndarray]:
        """out = src @ W.T for each (W, out): quantize src once per block format (same row split
        as src's producer, so no barrier), then the matmuls split by weight rows. Returns the
        matmul args (an `out` of None is set per call through them)."""
        mk = self.tr.matmul_kernels
        quantized: dict[str | None, int] = {None: _addr(src)}
        for w, _ in targets:
            k = mk.kernels(w.qtype)
            if k.act not in quantized:
                xq = self.a.xq[k.act]
                quantized[k.act] = _addr(xq)
                self._node("task_quant", tasks.QUANT, fn=k.quantize_address, src=_addr(src),
                           dst=_addr(xq), nb=n_cols // k.block_elems, m_at=m_at)
        self.graph.barrier()
        out_args = []
        for w, out in targets:
            k = mk.kernels(w.qtype)
            nb = w.n_cols // k.block_elems  # float types: block_elems 1, nb = K
            out_args.append(self._node(
                "task_matmul", tasks.MATMUL, fn=k.rows_address, w=w.address,
                x=quantized[k.act], out=0 if out is None else _addr(out), nb=nb,
                n_rows=w.n_rows, m_at=m_at))
        self.graph.barrier()
        return out_args

    def rope_store(self, layer: int) -> None:
        """rope(q), rope(k) in place; k, v -> this layer's cache rows STEP.kv_rows, as f16."""
        tr, a, hp = self.tr, self.a, self.tr.hp
        cos, sin = ops.rope_tables(hp.n_rot, tr.rope, tr.n_ctx)
        self._node("task_rope_store", tasks.ROPE_STORE, rope=self.op["rope"], q=_addr(a.q),
                   k=_addr(a.k), v=_addr(a.v), n_head=hp.n_head, n_kv_head=hp.n_head_kv,
                   head_dim=hp.head_dim, half_rot=hp.n_rot // 2, cos=_addr(cos), sin=_addr(sin),
                   n_table=cos.shape[0], k_cache=_addr(tr.cache.k[0, layer]),
                   v_cache=_addr(tr.cache.v[0, layer]))
        self.graph.barrier()

    def attention(self, layer: int) -> None:
        """q = attention(q, this layer's cache), over STEP's chunks and attention split."""
        tr, a, hp = self.tr, self.a, self.tr.hp
        self._node("task_attention", tasks.ATTENTION, f16acc=tr.attention.f16acc_address,
                   exact=tr.attention.exact_address, q=_addr(a.q), k_cache=_addr(tr.cache.k[0, layer]),
                   v_cache=_addr(tr.cache.v[0, layer]), out=_addr(a.q),
                   scratch=_addr(tr._scratch), scratch_bytes=4 * tr._scratch_stride(),
                   n_head=hp.n_head, n_kv_head=hp.n_head_kv, head_dim=hp.head_dim,
                   scale=1.0 / float(np.sqrt(hp.head_dim)))
        self.graph.barrier()


__all__ = ["Chunk", "ContextOverflowError", "KVCache", "Transformer"]
