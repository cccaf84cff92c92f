"""The transformer: weights, KV cache and the forward pass over batches of chunks.

Each family's block lives in engine.arch (llama.py, qwen.py, phi3.py, gemma.py), written once
against a builder; here is what every family shares:

    x = embed(prompt) * embed_scale                     # [T, n_embd]: token rows, or an
                                                        # embedding span's (engine.prompt;
                                                        # gemma3 feeds those unscaled)
    for each layer:  block(x)                           # e.g. llama:
        h = rms_norm(x) * attn_norm
        q, k, v = h @ Wq, h @ Wk, h @ Wv; rope(q, k)     # [T, n_head|n_head_kv, head_dim]
        k, v -> KV cache (f16, or q8_0 / q4_0 blocks) at their rows (engine.kv: full, or a
                                                        ring for windowed layers)
        x += attention(q, K cache, V cache) @ Wo         # causal, grouped-query
        h = rms_norm(x) * ffn_norm
        x += (silu(h @ Wgate) * (h @ Wup)) @ Wdown
    logits = softcap(rms_norm(x) * output_norm @ Woutput)  # [T, n_vocab]

Several sequences can be evaluated in one call (the server batches requests): their tokens share
every matmul, so the weights are read once per step; attention runs per sequence over its slot.

How it runs: at the first call the pass above is laid out once as a graph of compiled tasks
(engine.builders.GraphBuilder, one node per step of the block, pointing at fixed scratch buffers
and at the weights), and every call runs that whole graph on the native worker pool in one
dispatch, its threads claiming shares of each segment between barriers (engine.kernels.pool,
.tasks); how many threads a run uses is the governor's pick from measured run times
(engine.kernels.governor). So the Python work per call is constant, not per layer: embed the
tokens, fill the STEP block (positions, cache rows, the chunk tables, the attention split), start
the graph. `forward_eager` runs the same blocks op by op (engine.builders.EagerBuilder); both
give the same bits.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, cast

import numpy as np

from . import lora_side
from .builders import EagerBuilder, GraphBuilder
from .delta_net_layer import ChunkRows
from .formats import quants
from .formats.repack import RepackedMatrix
from .gguf import GGUFFile, ModelLoadError
from .hparams import HParams
from .kernels import ops, rotary, tasks
from .kernels.attention import AttentionKernel
from .kernels.attention_ir import blocked_scratch_floats, exact_scratch_floats, f16acc_scratch_floats
from .kernels.attention_ir.quantized import scratch_floats as quantized_scratch_floats
from .kernels.attention_quantized import QuantizedAttentionKernel
from .kernels.governor import ThreadGovernor
from .kernels.matmul import MatmulKernels
from .kernels.pool import Graph, Pool
from .kv import KVCache
from .kv_types import F16, KVType
from .lora import LoraDelta
from .prompt import EmbeddingSpan, Prompt, TokenSpan, as_prompt
from .weights import Weights, load_weights


def _out_rows(chunks: list[Chunk], spans: list[tuple[int, int]]) -> np.ndarray:
    """int64 [n_out]: the rows whose logits a `last` forward computes, each chunk's last k."""
    rows: list[int] = []
    for c, (_, b) in zip(chunks, spans):
        rows.extend(range(b - c.logits, b))
    return np.array(rows, np.int64)


def _by_chunk(logits: np.ndarray, chunks: list[Chunk]) -> list[np.ndarray]:
    """[n_out, n_vocab] rows of the chunks that asked for logits -> one entry per chunk: an
    empty array (k = 0), the last row's [n_vocab] (k = 1) or the last k rows' [k, n_vocab]."""
    out, at = [], 0
    for c in chunks:
        k = c.logits
        out.append(np.empty(0, np.float32) if k == 0 else logits[at] if k == 1
                   else logits[at:at + k])
        at += k
    return out


class ContextOverflowError(ValueError):
    """More tokens than a sequence's context holds."""

    def __init__(self, n_tokens: int, n_ctx: int) -> None:
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx
        super().__init__(f"{n_tokens} tokens do not fit in a context of {n_ctx}")


class Chunk:
    """Positions for one slot (a Prompt, or a plain list of token ids), written at pos0 after
    the slot is truncated to pos0 (pos0 <= what the slot holds).

    `logits`: how many of this chunk's last rows a `last` forward returns logits for: 0 (a
    prompt read in several chunks needs only its final chunk's: each row saves a pass over the
    output matrix, 178 MB for Gemma 3 270M), 1 (True: the last row, [n_vocab]) or k (the last
    k rows, [k, n_vocab]: a draft's verification). `lora`: the user scale of each of the
    load's LoRA adapters for this chunk's sequence, when not the merged ones (engine.lora_side)."""

    __slots__ = ("logits", "lora", "pos0", "prompt", "slot")

    def __init__(self, slot: int, prompt: Prompt | Sequence[int], pos0: int,
                 logits: int = 1, lora: Sequence[float] | None = None) -> None:
        self.slot = slot
        self.prompt = as_prompt(prompt)
        self.pos0 = pos0
        self.logits = int(logits)
        self.lora = None if lora is None else tuple(lora)  # adapter scales, None: the load's

    def __len__(self) -> int:
        return len(self.prompt)

    @property
    def tokens(self) -> list[int]:
        """The token ids of a chunk of tokens only (what a Chunk held before spans)."""
        if self.prompt.has_embeddings:
            raise ValueError("this chunk holds embedding rows: read its prompt's spans")
        return self.prompt.token_ids()

    def __repr__(self) -> str:
        return f"Chunk(slot={self.slot}, {self.prompt!r}, pos0={self.pos0}, logits={self.logits})"


class _Inputs(NamedTuple):
    """What a forward call reads: ids int64 [T] (0 at embedded positions, not looked up),
    (first row, float32 [n, n_embd]) of every embedding span, and per chunk the rows [a, b) of
    its bidirectional span (int64 [C, 2]; a == b: none)."""
    ids: np.ndarray
    embedded: list[tuple[int, np.ndarray]]
    bidirectional: np.ndarray


class _Activations:
    """Scratch rows for up to `capacity` tokens of one forward call (f32 unless said)."""

    def __init__(self, hp: HParams, capacity: int, xq_bytes: dict[str, int]) -> None:
        self.capacity = capacity
        T, E, F = capacity, hp.n_embd, hp.n_ff  # n_ff: the widest layer's
        self.x = np.empty((T, E), np.float32)            # residual stream
        self.o = np.empty((T, E), np.float32)            # last block's output, added to x next
        self.h = np.empty((T, E), np.float32)            # normed x
        widest = [max(hp.layer_dims(li)[d] for li in range(hp.n_layer)) for d in ("q_dim", "kv_dim")]
        self.q = np.empty((T, widest[0]), np.float32)    # queries, then attention output in place
        self.k = np.empty((T, widest[1]), np.float32)    # (each layer's rows as wide as it has
        self.v = np.empty((T, widest[1]), np.float32)    #  them: engine.builders)
        self.g = np.empty((T, F), np.float32)            # gate, then silu(gate) * up in place
        self.u = np.empty((T, F), np.float32)            # up
        # activations quantized for the matmuls, one buffer per block format (quants.pack_activations)
        self.xq = {act: quants.empty_packed(n) for act, n in xq_bytes.items()}
        self._named: dict[str, np.ndarray] = {}

    def scratch(self, name: str, shape: tuple[int, ...], dtype: type[np.generic]) -> np.ndarray:
        """A family's own buffer (a mixture's routing tables and expert rows), made 64-byte
        aligned at the first ask for `name` and kept, like the rows above, for this capacity."""
        buf = self._named.get(name)
        if buf is None:
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            buf = self._named[name] = quants.empty_packed(nbytes).view(dtype).reshape(shape)
        elif buf.shape != shape or buf.dtype != dtype:  # graphs point into the first one
            raise ValueError(f"scratch {name} is {buf.dtype} {buf.shape}, asked {dtype} {shape}")
        return buf

    def named(self, name: str, width: int | None) -> np.ndarray:
        """A family's float32 rows [capacity, width] by name (engine.arch.base: a projection's
        target, a per-token input); width None: one made before."""
        if width is not None:
            return self.scratch(name, (self.capacity, width), np.float32)
        buf = self._named.get(name)
        if buf is None:
            raise ValueError(f"no activation rows named {name!r}")
        return buf


def _addr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def _prepared(w: Weights, mk: MatmulKernels, threads: int = 1) -> Weights:
    """The weights with every block matrix in the layout its kernel wants (mk.prepare: repacked
    copies for the row-interleaved kernels), and the output matrix too: a decode step reads it
    whole for one row, and it is the largest matrix of a large-vocabulary model (Gemma 3 270M:
    178 MB Q8_0, 60% of a step; repacked it streams at ~31 GB/s against the file layout's ~25,
    scripts/bench_hugepages.py; decode 107 -> 133 tok/s, scripts/profile_decode.py). A tied
    token_embd stays mapped for the lookups, which read a few of its rows a step: its pages are
    released after the repack and come back from the page cache as the lookups read them."""
    # a prepared matrix may be a RepackedMatrix: the kernels take it wherever a QuantMatrix goes
    def layer_prepared(layer: Any) -> Any:
        return (layer.with_matrices(lambda m: mk.prepare(m, file_backed=True))
                .with_stacks(lambda s: mk.prepare_stack(s, file_backed=True)))

    # layers repack side by side on the model's threads: first touches of the new pages and the
    # compiled repacks run outside the GIL. SmolLM2, 2 threads, a process's first load (what a
    # restart pays; a VM's fresh pages fault slowly): 549-698 ms -> 268-296 ms; later loads
    # 200-240 ms either way (engine.api.Model six times per process, two processes each)
    with ThreadPoolExecutor(max(1, threads)) as ex:
        output_future = ex.submit(mk.prepare, w.output, file_backed=True)
        layers = list(ex.map(layer_prepared, w.layers))
        output = output_future.result()
    return dataclasses.replace(w, layers=layers, output=cast(Any, output))


class Transformer:
    """Weights + kernels + KV cache; evaluates batches of chunks. Not thread-safe: one caller.

    `forward` runs the whole pass as one graph of compiled tasks on the native pool (see
    engine.kernels.pool and engine.kernels.tasks): per call, Python only embeds the tokens,
    fills the STEP block (positions, cache rows, chunk tables, attention split) and starts the
    graph. `forward_eager` is the same computation op by op from Python, kept as the fused
    path's readable twin: both give the same bits.
    """

    def __init__(self, f: GGUFFile, hp: HParams, n_ctx: int, n_slots: int, n_threads: int,
                 flash_attn: bool = True, images: bool = False,
                 lora: dict[str, list[LoraDelta]] | None = None,
                 kv_types: tuple[KVType, KVType] = (F16, F16), pool: Pool | None = None,
                 lora_scales: tuple[float, ...] = ()) -> None:
        """`lora`: LoRA adapter deltas merged into the weights at load (engine.lora).
        `images`: the model will be fed image spans; a family whose image rows see each
        other (gemma3) then gets the bidirectional kernels and a ring mirror to match (engine.kv),
        which a text-only load does without. kv_types: the cache's key and value row types; a
        quantized cache stores and reads its rows with the quantized tasks and attention kernel
        (engine.kernels.kvq_tasks, engine.kernels.attention_quantized), whose rules
        _check_kv_types states.
        `pool`: another model's worker pool to run on (a draft model beside its target: the
        two never run at once, and one pool's threads instead of two keeps an idle pool's
        spinning workers off the cores the other needs); closing this model leaves it open.
        `lora_scales`: the user scale each of `lora`'s adapters is merged at (a chunk asking
        for others gets the difference as a side path, engine.lora_side)."""
        self.hp = hp
        self.n_ctx = n_ctx
        self.bidirectional = images and hp.spec.bidirectional_spans
        self.weights = load_weights(f, hp, n_ctx, lora)
        self.lora_bytes = self.weights.lora_bytes  # merged adapters' float32 copies
        self.lora_scales = lora_scales  # the user scale each adapter was merged at
        self.block = hp.spec.block
        self._owns_pool = pool is None
        self.pool = Pool(n_threads) if pool is None else pool
        self.governor = ThreadGovernor(n_threads)  # how many of them each run uses
        try:
            qtypes = {m.qtype for m in self.weights.matrices()}
            self.matmul_kernels = MatmulKernels(qtypes, pool=self.pool)
            self.weights = _prepared(self.weights, self.matmul_kernels, n_threads)
            self.attention = AttentionKernel(pool=self.pool, flash_attn=flash_attn,
                                             sinks=hp.spec.attn_sinks,
                                             bidirectional=self.bidirectional)
            self.tasks = tasks.load_tasks(self.attention.f16c)
            self.ops = ops.load_ops()
            self.kv_attention = _check_kv_types(f.path, hp, kv_types, flash_attn, self.bidirectional,
                                                n_threads)
            self.cache = KVCache(hp, n_slots, n_ctx, self.bidirectional, *kv_types)
        except BaseException:
            if self._owns_pool:
                self.pool.close()
            raise
        factors = self.weights.rope_freqs
        yarn = rotary.RopeSpec(0.0, ext_factor=hp.yarn_ext_factor, attn_factor=hp.yarn_attn_factor,
                               n_ctx_orig=hp.yarn_n_ctx_orig, beta_fast=hp.yarn_beta_fast,
                               beta_slow=hp.yarn_beta_slow)  # llama.cpp's cparams: every layer's
        full = dataclasses.replace(yarn, base=hp.rope_base, freq_scale=hp.rope_freq_scale,
                                   freq_factors=None if factors is None else tuple(float(f) for f in factors))
        local = dataclasses.replace(yarn, base=hp.rope_base_swa or hp.rope_base,  # windowed layers:
                                    freq_scale=hp.rope_freq_scale_swa)            # own base
        self.ropes = [local if hp.layer_window(li) else full for li in range(hp.n_layer)]
        self.rope_op = "rope_neox" if hp.spec.rope_neox else "rope"
        self._acts: _Activations | None = None
        self._graphs: dict[str, tuple[Graph, np.ndarray | None]] = {}
        self._step = np.zeros(len(tasks.STEP.fields), np.int64)  # the STEP block, fixed address
        self._step_arrays: tuple[np.ndarray, ...] = ()  # what STEP points into (kept alive)
        self._scratch = np.empty(0, np.float32)

    @property
    def repacked_bytes(self) -> int:
        """Bytes the repacked weight copies (engine.formats.repack) add to the mapped file: each copy's
        size less its source's pages, which are released (a tied output's count whole: the
        lookups may read every row of the mapped token_embd back in)."""
        te = self.weights.token_embd
        return sum(m.nbytes - (0 if m.source is te else m.source.nbytes)
                   for m in self.weights.matrices() if isinstance(m, RepackedMatrix))

    def token_rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 [n, n_embd]: the token-embedding rows of ids, before the embedding scale
        (what an EmbeddingSpan stands in for)."""
        te = self.weights.token_embd
        return quants.dequantize(te.raw[ids], te.qtype, te.n_cols)

    def embed(self, inputs: _Inputs) -> np.ndarray:
        """float32 [T, n_embd]: the chunks' input rows, token lookups and embedding spans' rows,
        times the family's embedding scale (a span's rows too unless the family feeds them raw:
        gemma3, whose graph in llama.cpp scales a batch of token ids only)."""
        scale = np.float32(self.hp.embed_scale)
        if not inputs.embedded:
            x = self.token_rows(inputs.ids)
            if scale != 1.0:
                x *= scale
            return x
        x = np.empty((inputs.ids.shape[0], self.hp.n_embd), np.float32)     # [T, n_embd]
        looked_up = np.ones(inputs.ids.shape[0], bool)
        for row, rows in inputs.embedded:
            x[row:row + rows.shape[0]] = rows
            looked_up[row:row + rows.shape[0]] = False
        if looked_up.any():
            x[looked_up] = self.token_rows(inputs.ids[looked_up])
        if scale != 1.0:
            x[looked_up if self.hp.spec.raw_spans else slice(None)] *= scale
        return x

    def token_inputs(self, inputs: _Inputs) -> dict[str, np.ndarray]:
        """The family's own per-token rows (ArchSpec.token_inputs: gemma4's per-layer token
        embeddings), by buffer name, float32 [T, width]."""
        make = self.hp.spec.token_inputs
        return {} if make is None else make(self.weights.extra, self.hp, inputs.ids)

    def _finish_logits(self, logits: np.ndarray) -> np.ndarray:
        if self.hp.final_softcap:
            ops.softcap(logits, self.hp.final_softcap, out=logits)
        return logits

    def _check(self, chunks: list[Chunk]) -> tuple[_Inputs, list[tuple[int, int]]]:
        """Validate the chunks; returns their inputs and per-chunk row spans [a, b)."""
        hp, cache = self.hp, self.cache
        if not chunks:
            raise ValueError("no chunks to evaluate")
        spans = []
        start = 0
        max_chunk = cache.layout.max_chunk()
        ids: list[int] = []
        embedded: list[tuple[int, np.ndarray]] = []
        bidirectional = np.zeros((len(chunks), 2), np.int64)                # [C, 2]
        for ci, c in enumerate(chunks):
            n = len(c.prompt)
            if not n:
                raise ValueError("empty chunk")
            if not 0 <= c.slot < len(cache.tokens):
                raise ValueError(f"slot {c.slot} does not exist (0..{len(cache.tokens) - 1})")
            end_pos = c.pos0 + n
            if end_pos > cache.n_ctx:
                raise ContextOverflowError(end_pos, cache.n_ctx)
            held = len(cache.tokens[c.slot])
            if not 0 <= c.pos0 <= held:
                raise ValueError(f"slot {c.slot} holds {held} tokens; cannot append at {c.pos0}")
            if not cache.layout.resumable(cache.written[c.slot], c.pos0):
                raise ValueError(f"slot {c.slot} no longer holds the window before position "
                                 f"{c.pos0} (its sliding-window layers moved on)")
            if n > max_chunk:
                raise ValueError(f"a chunk of {n} tokens is longer than this model's "
                                 f"sliding-window cache allows ({max_chunk})")
            if not 0 <= c.logits <= n:
                raise ValueError(f"a chunk of {n} rows cannot give the logits of its last {c.logits}")
            at = start
            for span in c.prompt.spans:
                if isinstance(span, TokenSpan):
                    ids.extend(span.ids)
                else:
                    if span.n_embd != hp.n_embd:
                        raise ValueError(f"embedding span {span.key!r} has rows of {span.n_embd}, "
                                         f"the model {hp.n_embd}")
                    ids.extend([0] * len(span))  # not looked up
                    embedded.append((at, span.rows))
                    if span.bidirectional:
                        bidirectional[ci] = self._bidirectional_rows(span, at - start, bidirectional[ci])
                at += len(span)
            spans.append((start, start + n))
            start += n
        if len({c.slot for c in chunks}) != len(chunks):
            raise ValueError("two chunks for the same slot in one call")
        tokens = np.array(ids, np.int64)                                    # [T]
        bad = (tokens < 0) | (tokens >= hp.n_vocab)
        if bad.any():
            raise ValueError(f"token id {int(tokens[bad][0])} is outside the vocabulary "
                             f"(0..{hp.n_vocab - 1})")
        return _Inputs(tokens, embedded, bidirectional), spans

    def _bidirectional_rows(self, span: EmbeddingSpan, at: int, before: np.ndarray) -> tuple[int, int]:
        """The chunk rows [a, b) of a bidirectional span at chunk row `at`, or why not: its rows
        must all be in this chunk (a slice cannot see the rows of another call), one such span
        per chunk, and a family that attends so (its rings mirror a window and a chunk)."""
        if not self.hp.spec.bidirectional_spans:
            raise ValueError(f"embedding span {span.key!r} asks for bidirectional attention, "
                             f"which {self.hp.spec.name} does not do")
        if not self.bidirectional:
            raise ValueError(f"embedding span {span.key!r} asks for bidirectional attention: "
                             "load the model with images=True")
        if not span.is_whole:
            raise ValueError(f"embedding span {span.key!r} attends bidirectionally: a chunk must "
                             "hold all of its rows (Prompt.chunk_end)")
        if before[1] > before[0]:
            raise ValueError("a chunk holds at most one bidirectional embedding span")
        return at, at + len(span)

    # -- the fused path --------------------------------------------------------------------------
    def forward(self, chunks: list[Chunk], output: str = "last") -> list[np.ndarray]:
        """Run all chunks through the model; per chunk return logits (`last`: of its last
        `logits` rows, see Chunk; `all`: [n, n_vocab]) or the final normed hidden states
        (`hidden`: [n, n_embd])."""
        if output not in ("last", "all", "hidden"):
            raise ValueError(f"unknown output kind {output!r}")
        # a state per sequence (qwen35) runs on the eager builder
        if self.hp.spec.recurrent is not None:
            return self.forward_eager(chunks, output)
        if self.lora_scales and any(self._lora_offsets(c) is not None for c in chunks):
            # a chunk at other adapter scales needs the side path: op by op
            return self.forward_eager(chunks, output)
        inputs, spans = self._check(chunks)
        T = inputs.ids.shape[0]
        acts = self._activations_for(T)
        graph, out_args = self._graph(output)
        acts.x[:T] = self.embed(inputs)
        for name, rows in self.token_inputs(inputs).items():
            acts.named(name, rows.shape[1])[:T] = rows

        counts = [b - a for a, b in spans]
        positions = np.concatenate([np.arange(c.pos0, c.pos0 + len(c), dtype=np.int64)
                                    for c in chunks])                              # [T]
        kv_rows, kv_mirror, chunk_tables = self.cache.layout.step_tables(
            [c.slot for c in chunks], [c.pos0 for c in chunks], counts, positions)
        kind = self.governor.kind(output, T, sum(n * (c.pos0 + n) for c, n in zip(chunks, counts)))
        threads = self.governor.choose(kind)
        seg_start, segs = tasks.split_attention([(b - a, c.pos0) for c, (a, b) in zip(chunks, spans)],
                                                self.hp.n_head, threads)
        out_rows = _out_rows(chunks, spans)                                        # [n_out]
        n_out = out_rows.shape[0] if output == "last" else T
        result = None
        if out_args is not None:
            result = np.empty((n_out, self.hp.n_vocab), np.float32)                # logits
            tasks.MATMUL.fill(out_args, out=_addr(result))
        tasks.STEP.fill(self._step, n_tokens=T, n_out=n_out, n_chunks=len(chunks),
                        positions=_addr(positions), kv_rows=_addr(kv_rows),
                        kv_mirror=_addr(kv_mirror), chunks=_addr(chunk_tables),
                        seg_start=_addr(seg_start), segs=_addr(segs), out_rows=_addr(out_rows),
                        bidirectional=_addr(inputs.bidirectional))
        self._step_arrays = (positions, kv_rows, kv_mirror, chunk_tables, seg_start, segs, out_rows,
                             inputs.bidirectional)
        started = time.perf_counter()
        self.pool.run(graph, _addr(self._step), threads)
        self.governor.record(kind, threads, time.perf_counter() - started)

        for c in chunks:
            self.cache.stored(c.slot, c.prompt.position_keys(), c.pos0)
        if output == "hidden":
            return [acts.h[a:b].copy() for a, b in spans]
        assert result is not None
        self._finish_logits(result)
        if output == "last":
            return _by_chunk(result, chunks)
        return [result[a:b] for a, b in spans]

    def _activations_for(self, n_tokens: int) -> _Activations:
        """Scratch for n_tokens, grown by doubling (graphs point into it, so they are rebuilt)."""
        if self._acts is None or self._acts.capacity < n_tokens:
            old = self._acts.capacity if self._acts is not None else 4
            capacity = max(n_tokens, 2 * old)
            xq_bytes: dict[str, int] = {}
            for m in self.weights.matrices():
                k = self.matmul_kernels.kernels_for(m)
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
        """The whole forward pass as task nodes: the family's block per layer, then the head."""
        w, a = self.weights, self._acts
        assert a is not None
        b = GraphBuilder(self, a)
        if self._scratch.size < self.pool.n_threads * self._scratch_stride():
            self._scratch = np.empty(self.pool.n_threads * self._scratch_stride(), np.float32)
        if self.hp.spec.prologue is not None:
            self.hp.spec.prologue(b, w.extra)
        for li, layer in enumerate(w.layers):
            b.begin_layer(li)
            self.block(b, layer, li)
        o = a.o if b.o_pending else None  # a block may end with o added already (gemma4)
        if output == "hidden":
            b.norm_rows(a.x, o, w.output_norm, a.h)                            # h = rms_norm(x += o)
            return b.graph, None
        m_at = tasks.M_OUT if output == "last" else tasks.M_TOKENS
        b.norm_rows(a.x, o, w.output_norm, a.h, m_at=m_at, gather=output == "last")
        out_args = b.matmuls(a.h, self.hp.n_embd, [(w.output, None)], m_at=m_at)[0]  # h @ Wout
        return b.graph, out_args

    def _scratch_stride(self) -> int:
        """Floats of attention scratch per thread: the scores rows (exact path), the f16 q rows
        of the heads either path runs together, or the quantized kernel's q8_0 rows."""
        hp = self.hp
        return max(max(exact_scratch_floats(self.n_ctx, hp.n_head, d["n_head_kv"]),
                       blocked_scratch_floats(d["head_dim"]),
                       f16acc_scratch_floats(hp.n_head, d["n_head_kv"], d["head_dim"]),
                       quantized_scratch_floats(d["head_dim"]) if self.kv_attention is not None else 0)
                   for d in map(hp.layer_dims, range(hp.n_layer)))

    # -- the eager twin --------------------------------------------------------------------------
    def forward_eager(self, chunks: list[Chunk], output: str = "last") -> list[np.ndarray]:
        """`forward` op by op from Python (the same kernels, the same bits)."""
        if output not in ("last", "all", "hidden"):
            raise ValueError(f"unknown output kind {output!r}")
        hp, cache = self.hp, self.cache
        inputs, spans = self._check(chunks)
        positions = np.concatenate([np.arange(c.pos0, c.pos0 + len(c)) for c in chunks])
        b = EagerBuilder(self, self.embed(inputs), chunks, spans, positions, inputs.bidirectional)
        b.lora_rows = lora_side.row_offsets([self._lora_offsets(c) for c in chunks], spans,
                                            len(self.lora_scales))
        b.bufs.update(self.token_inputs(inputs))
        if hp.spec.prologue is not None:
            hp.spec.prologue(b, self.weights.extra)
        if cache.recurrent is not None:
            b.recurrent_chunks = self._recurrent_chunks(chunks, spans)
        try:
            for li, layer in enumerate(self.weights.layers):
                b.begin_layer(li)
                self.block(b, layer, li)
        except BaseException:
            if cache.recurrent is not None:  # some layers' states moved on: start these over
                for c in chunks:
                    cache.truncate(c.slot, 0)
            raise
        x = b.residual()                                                    # [T, n_embd]
        for c in chunks:
            cache.stored(c.slot, c.prompt.position_keys(), c.pos0)

        if output == "hidden":
            hn = ops.rms_norm(x, self.weights.output_norm, hp.rms_eps)
            return [hn[a:b] for a, b in spans]
        if output == "last":
            rows = _out_rows(chunks, spans)
            if rows.size == 0:
                return _by_chunk(np.empty((0, hp.n_vocab), np.float32), chunks)
            hn = ops.rms_norm(np.ascontiguousarray(x[rows]), self.weights.output_norm, hp.rms_eps)
            logits = self._finish_logits(b.adapted(self.weights.output, hn, rows))  # [n_out, n_vocab]
            return _by_chunk(logits, chunks)
        hn = ops.rms_norm(x, self.weights.output_norm, hp.rms_eps)
        logits = self._finish_logits(b.adapted(self.weights.output, hn))    # [T, n_vocab]
        return [logits[a:b] for a, b in spans]

    def _lora_offsets(self, c: Chunk) -> tuple[float, ...] | None:
        return lora_side.offsets(c.lora, self.lora_scales) if self.lora_scales else None

    def _recurrent_chunks(self, chunks: list[Chunk], spans: list[tuple[int, int]]) -> list[ChunkRows]:
        """Each chunk's slot state made the state at its pos0 (a chunk written over positions
        its slot holds goes back to a checkpoint, or raises), and the checkpoints it takes."""
        cache, state = self.cache, self.cache.recurrent
        assert state is not None
        for c in chunks:
            if c.pos0 != len(cache.tokens[c.slot]) or c.pos0 == 0:
                cache.truncate(c.slot, c.pos0)
        return [ChunkRows(c.slot, a, b, state.plan(c.slot, c.pos0, b - a, c.logits > 0))
                for c, (a, b) in zip(chunks, spans)]

    def close(self) -> None:
        """Stop the pool's threads and drop the weights, cache and scratch."""
        if self.pool is not None:
            self.matmul_kernels.close()
            self.attention.close()
            if self.kv_attention is not None:
                self.kv_attention.close()
            if self._owns_pool:
                self.pool.close()
            self.pool = None  # type: ignore[assignment]
        self._graphs.clear()
        self._acts = None
        self.weights = None  # type: ignore[assignment]
        self.cache = None  # type: ignore[assignment]


def _check_kv_types(path: object, hp: HParams, kv_types: tuple[KVType, KVType], flash_attn: bool,
                    bidirectional: bool, n_threads: int) -> QuantizedAttentionKernel | None:
    """The quantized attention kernel a cache of these types needs (None for f16), or a
    ModelLoadError: a quantized K or V needs flash attention (llama.cpp refuses a quantized V
    without it; our non-flash path reads f16 only), both quantized (a mixed f16/quantized pair
    is not built), whole blocks per head, and none of softcap, sinks, image spans."""
    type_k, type_v = kv_types
    if not (type_k.quantized or type_v.quantized):
        return None
    problem = None
    if not flash_attn:
        problem = "a quantized KV cache requires flash_attn (as llama.cpp's quantized V cache does)"
    elif not (type_k.quantized and type_v.quantized):
        problem = "type_k and type_v must both be quantized or both f16"
    elif hp.attn_softcap or hp.spec.attn_sinks or bidirectional:
        problem = "a quantized KV cache does not serve attention softcap, sinks or image spans yet"
    else:
        try:
            for li in range(hp.n_layer):
                type_k.row_bytes(hp.layer_head_dim(li))
        except ValueError as e:
            problem = str(e)
    if problem is not None:
        raise ModelLoadError(str(path), f"KV cache {type_k.name}/{type_v.name}: {problem}")
    return QuantizedAttentionKernel(type_k, type_v, n_threads)


__all__ = ["Chunk", "ContextOverflowError", "KVCache", "Prompt", "Transformer"]
