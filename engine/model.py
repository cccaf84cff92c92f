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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from . import quants
from .gguf import GGUFFile, ModelLoadError
from .hparams import HParams
from .kernels import ops
from .kernels.attention import AttentionKernel
from .kernels.matmul import MatmulKernels


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
        return t

    def matrix(name: str, n_cols: int, n_rows: int) -> quants.QuantMatrix:
        t = info(name, (n_cols, n_rows))
        if t.qtype not in quants.SUPPORTED:
            raise ModelLoadError(path, f"tensor {name}: type {t.qtype.name} is not supported "
                                       f"(supported: {', '.join(sorted(q.name for q in quants.SUPPORTED))})")
        raw = f.tensor_data(name).reshape(n_rows, -1)  # uint8 [n_rows, row_bytes]
        return quants.QuantMatrix(raw, t.qtype, n_rows, n_cols)

    def vector(name: str, n: int) -> np.ndarray:
        t = info(name, (n,))
        raw = f.tensor_data(name).reshape(1, -1)
        if t.qtype not in quants.SUPPORTED:
            raise ModelLoadError(path, f"tensor {name}: type {t.qtype.name} is not supported")
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


class Transformer:
    """Weights + kernels + KV cache; evaluates batches of chunks. Not thread-safe: one caller."""

    def __init__(self, f: GGUFFile, hp: HParams, n_ctx: int, n_slots: int, n_threads: int) -> None:
        self.hp = hp
        self.weights = _load_weights(f, hp)
        qtypes = {m.qtype for m in self.weights.matrices()}
        self.matmul_kernels = MatmulKernels(qtypes, n_threads=n_threads)
        self.attention = AttentionKernel(n_threads=n_threads)
        self.cache = KVCache(hp, n_slots, n_ctx)
        factors = self.weights.rope_freqs
        self.rope = ops.RopeSpec(hp.rope_base, hp.rope_freq_scale,
                                 None if factors is None else tuple(float(f) for f in factors))

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        te = self.weights.token_embd
        return quants.dequantize(te.raw[tokens], te.qtype, te.n_cols)  # [T, n_embd]

    def forward(self, chunks: list[Chunk], output: str = "last") -> list[np.ndarray]:
        """Run all chunks through the model; per chunk return logits (`last`: [n_vocab], `all`:
        [n, n_vocab]) or the final normed hidden states (`hidden`: [n, n_embd])."""
        hp, cache, mm = self.hp, self.cache, self.matmul_kernels.matmul
        spans = []
        start = 0
        for c in chunks:
            if not c.tokens:
                raise ValueError("empty chunk")
            end_pos = c.pos0 + len(c.tokens)
            if end_pos > cache.n_ctx:
                raise ContextOverflowError(end_pos, cache.n_ctx)
            if c.pos0 > len(cache.tokens[c.slot]):
                raise ValueError(f"slot {c.slot} holds {len(cache.tokens[c.slot])} tokens; "
                                 f"cannot append at {c.pos0}")
            bad = [t for t in c.tokens if not 0 <= t < hp.n_vocab]
            if bad:
                raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{hp.n_vocab - 1})")
            spans.append((start, start + len(c.tokens)))
            start += len(c.tokens)
        tokens = np.fromiter((t for c in chunks for t in c.tokens), dtype=np.int64, count=start)
        positions = np.concatenate([np.arange(c.pos0, c.pos0 + len(c.tokens)) for c in chunks])
        T = start

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
        if output == "all":
            hn = ops.rms_norm(x, self.weights.output_norm, hp.rms_eps)
            logits = mm(self.weights.output, hn)                            # [T, n_vocab]
            return [logits[a:b] for a, b in spans]
        raise ValueError(f"unknown output kind {output!r}")

    def close(self) -> None:
        self.matmul_kernels.close()
        self.weights = None  # type: ignore[assignment]
        self.cache = None  # type: ignore[assignment]


__all__ = ["Chunk", "ContextOverflowError", "KVCache", "Transformer", "GGMLQuantizationType"]
