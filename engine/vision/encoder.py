"""The vision transformer of a projector file (SigLIP or CLIP), as llama.cpp's clip graph runs it.

    pixels  float32 [3, S, S]
    patches [n_patch, 3*p*p]  (channel, row, column) per patch, patches row by row
    x = patches @ patch_embd^T + bias            [n_patch, width]
        (CLIP: the class token APPENDED, as llama.cpp's ggml_concat(inp, class_embd, 1) does;
        position_embd row n_patch is then the class token's)  [n_pos, width]
    x += position_embd;  x = pre_ln(x) if the file has it
    per block:  x += attn_out(attention(ln1(x)));  x += ffn_down(act(ffn_up(ln2(x))))
        (non-causal: every position sees every other)
    x = post_ln(x) if the file has it            [n_pos, width]

Matmuls over all positions at once: F16 and F32 weights (the published files' types) are
packed at load into the panel GEMM's layout (engine/kernels/panel_gemm: register-blocked, split
across the threads by weight rows), Q, K and V as one [3 width, width] matrix; BF16 and Q8_0
weights go through the row kernels of engine/kernels/matmul as they are. Attention is blocked:
per head (heads spread over the threads) and per block of ATTN_BLOCK queries, scores = panel
GEMM of the head's packed keys (queries scaled first), softmax in place
(engine/kernels/row_softmax: 16 lanes, f32 sums), then the panel GEMM of its packed values, so
a block's [ATTN_BLOCK, n_pos] scores stay in cache instead of [n_pos, n_pos] per head going
through memory. Biases and the tanh GELU are the glue kernels of engine/kernels/ops (GELU with
ggml's f16 table), LayerNorm engine/kernels/layer_norm (the numpy `layer_norm` here is its
twin and serves other widths), quick-GELU numpy; all split by rows over the threads.
tests/support/vision_reference.py is the float64 twin of the whole encoder, and llama.cpp's own
embeddings (tests/data/vlm/) the outside check.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from engine import hugepages
from engine.formats import quants
from engine.formats.ggml_types import GGMLQuantizationType as T
from engine.kernels import amx_gemm, ops
from engine.kernels.amx_gemm import AmxGemm, AmxMatrix
from engine.kernels.layer_norm import LANES as NORM_LANES
from engine.kernels.layer_norm import layer_norm_rows
from engine.kernels.matmul import MatmulKernels
from engine.kernels.panel_gemm import PanelGemm, PanelMatrix
from engine.kernels.pool import Pool
from engine.kernels.row_softmax import LANES, softmax_rows
from engine.vision.mmproj import Projector, VisionLayer, VisionParams

ATTN_BLOCK = 192  # queries per attention block: [192, 4096] f32 scores are 3 MB
WIDE = 64         # panel of weights and keys (fewer broadcasts per FMA); values (N = head size) 32


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """ggml_norm then * w + b, per row; x float32 [n, width]."""
    mean = x.mean(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    d = x - mean
    var = (d * d).mean(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    return np.ascontiguousarray(d / np.sqrt(var + np.float32(eps)) * w + b, dtype=np.float32)


def _f16_table(f: np.ndarray) -> np.ndarray:
    return f.astype(np.float16).astype(np.float32)


def gelu_quick(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(1.702 x) through ggml's f16 table: f16 input, f16 result."""
    h = _f16_table(x).astype(np.float64)
    with np.errstate(over="ignore"):
        return _f16_table((h / (1.0 + np.exp(-1.702 * h))).astype(np.float32))


def gelu(x: np.ndarray) -> np.ndarray:
    """The tanh GELU with ggml's f16 table (ops.gelu_mul by ones)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return ops.gelu_mul(x, np.ones_like(x))


def f32_matrix(a: np.ndarray) -> quants.QuantMatrix:
    """A float32 [n_rows, n_cols] array as an F32 QuantMatrix (no copy if already contiguous)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    return quants.QuantMatrix(a.view(np.uint8).reshape(a.shape[0], -1), T.F32, a.shape[0], a.shape[1])


def patchify(pixels: np.ndarray, p: int) -> np.ndarray:
    """float32 [3, S, S] -> [n_patch, 3*p*p], as ggml's im2col lays out a stride-p conv."""
    c, h, w = pixels.shape
    x = pixels.reshape(c, h // p, p, w // p, p).transpose(1, 3, 0, 2, 4)  # [py, px, c, ky, kx]
    return np.ascontiguousarray(x.reshape((h // p) * (w // p), c * p * p), dtype=np.float32)


def panel_matrix(m: quants.QuantMatrix) -> PanelMatrix | None:
    """The weight packed for the panel GEMM, or None for types it does not take (BF16, Q8_0)."""
    dtype = {T.F16: np.float16, T.F32: np.float32}.get(m.qtype)
    if dtype is None:
        return None
    return PanelMatrix.pack(m.raw.view(dtype).reshape(m.n_rows, m.n_cols), WIDE)


def _stack(ms: list[quants.QuantMatrix]) -> quants.QuantMatrix | None:
    """Several matrices of one float type as one with their rows stacked (Q, K, V -> QKV)."""
    if len({m.qtype for m in ms}) != 1 or ms[0].qtype not in (T.F16, T.F32):
        return None
    raw = np.concatenate([m.raw for m in ms])
    return quants.QuantMatrix(raw, ms[0].qtype, sum(m.n_rows for m in ms), ms[0].n_cols)


class VisionEncoder:
    """Runs one projector file's ViT; `mk` is shared with its projector head."""

    def __init__(self, proj: Projector, n_threads: int = 1, amx: bool | None = None) -> None:
        self.proj, self.hp = proj, proj.hp
        types = {m.qtype for layer in proj.layers for m in (layer.q, layer.k, layer.v, layer.out,
                                                            layer.up, layer.down)}
        types |= {proj.patch_embd.qtype, T.F32}
        for name in ("mm.input_projection.weight", "mm.model.fc.weight", "mm.0.weight", "mm.2.weight"):
            if proj.has(name):
                types.add(proj.file.tensors[name].qtype)
        self.n_threads = n_threads
        self._pool = Pool(n_threads) if n_threads > 1 else None
        self.mk = MatmulKernels(types, pool=self._pool)
        # the ViT's threads: heads, row blocks and GEMM chunks are taken by whichever is free
        self._heads = ThreadPoolExecutor(n_threads) if n_threads > 1 else None
        self.gemm = PanelGemm(executor=self._heads, n_threads=n_threads)
        # AMX tiles where the CPU and OS have them (amx=None: whenever available)
        use_amx = amx_gemm.available() if amx is None else amx
        self.amx = AmxGemm(self._heads, n_threads) if use_amx else None
        self._ones = np.ones((0, 0), np.float32)
        # packed copies of the float weights, by id of the file's QuantMatrix
        self._panels: dict[int, PanelMatrix | AmxMatrix] = {}
        self._qkv: list[tuple[PanelMatrix | AmxMatrix, np.ndarray] | None] = []
        for m in [proj.patch_embd] + [w for ly in proj.layers for w in (ly.out, ly.up, ly.down)]:
            packed = self._pack(m)
            if packed is not None:
                self._panels[id(m)] = packed
                hugepages.release_file_pages(m.raw)  # the packed copy serves; the file's pages go
        for ly in proj.layers:
            qkv = _stack([ly.q, ly.k, ly.v])
            packed = self._pack(qkv) if qkv is not None else None
            self._qkv.append(None if packed is None else
                             (packed, np.concatenate([ly.q_b, ly.k_b, ly.v_b]).astype(np.float32)))
            if packed is not None:
                for m in (ly.q, ly.k, ly.v):
                    hugepages.release_file_pages(m.raw)

    def _pack(self, m: quants.QuantMatrix) -> PanelMatrix | AmxMatrix | None:
        if self.amx is None:
            return panel_matrix(m)
        dtype = {T.F16: np.float16, T.F32: np.float32}.get(m.qtype)
        return None if dtype is None else AmxMatrix.pack(m.raw.view(dtype).reshape(m.n_rows, m.n_cols))

    def _matmul(self, w: PanelMatrix | AmxMatrix, x: np.ndarray) -> np.ndarray:
        if isinstance(w, AmxMatrix):
            assert self.amx is not None
            return self.amx.matmul(w, x)
        return self.gemm.matmul(w, x)

    def rows(self, fn: Callable[[np.ndarray, np.ndarray], None], x: np.ndarray) -> np.ndarray:
        """out[r] = fn(x[r]) by blocks of rows spread over the threads (numpy and the compiled
        glue release the GIL); fn(x_rows, out_rows) writes its block."""
        out = np.empty_like(x)
        n = x.shape[0]
        step = -(-n // (4 * self.n_threads))
        blocks = [(x[i:i + step], out[i:i + step]) for i in range(0, n, step)]
        if self._heads is None or n < 64:
            fn(x, out)
        else:
            list(self._heads.map(lambda b: fn(*b), blocks))
        return out

    def layer_norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        eps = self.hp.eps
        if x.shape[1] % NORM_LANES == 0:  # the compiled kernel (the numpy one is its twin)
            def rows_kernel(xs: np.ndarray, out: np.ndarray) -> None:
                layer_norm_rows(xs, w, b, eps, out=out)
            return self.rows(rows_kernel, x)

        def block(xs: np.ndarray, out: np.ndarray) -> None:
            out[:] = layer_norm(xs, w, b, eps)
        return self.rows(block, x)

    def act(self, h: np.ndarray) -> np.ndarray:
        if not self.hp.use_gelu:
            return self.rows(lambda xs, out: out.__setitem__(slice(None), gelu_quick(xs)), h)
        if self._ones.shape[1:] != h.shape[1:] or self._ones.shape[0] < h.shape[0]:
            self._ones = np.ones(h.shape, np.float32)  # gelu(x) = gelu_mul(x, 1)
        ones = self._ones

        def block(xs: np.ndarray, out: np.ndarray) -> None:
            ops.gelu_mul(xs, ones[:xs.shape[0]], out=out)
        return self.rows(block, h)

    def linear(self, w: quants.QuantMatrix, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        packed = self._panels.get(id(w))
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = self._matmul(packed, x) if packed is not None else self.mk.matmul(w, x)
        return ops.add_bias(out, b, out=out) if b is not None else out

    def qkv(self, i: int, layer: VisionLayer, x: np.ndarray) -> tuple[np.ndarray, ...]:
        """Q, K and V of block i, each float32 [n, width] (views of one [n, 3 width] when fused)."""
        fused = self._qkv[i] if i < len(self._qkv) else None
        if fused is None:
            return (self.linear(layer.q, x, layer.q_b), self.linear(layer.k, x, layer.k_b),
                    self.linear(layer.v, x, layer.v_b))
        out = self._matmul(fused[0], np.ascontiguousarray(x, dtype=np.float32))
        ops.add_bias(out, fused[1], out=out)
        w = self.hp.width
        return out[:, :w], out[:, w:2 * w], out[:, 2 * w:]

    def attention(self, i: int, layer: VisionLayer, x: np.ndarray) -> np.ndarray:
        hp: VisionParams = self.hp
        n, dh = x.shape[0], hp.width // hp.n_head
        q, k, v = self.qkv(i, layer, x)
        heads = np.empty((n, hp.n_head, dh), np.float32)
        scale = np.float32(1.0 / math.sqrt(dh))

        def head_amx(h: int) -> None:
            assert self.amx is not None
            cols = slice(h * dh, (h + 1) * dh)
            keys, values = self.amx.pack_rows(k[:, cols]), self.amx.pack_cols(v[:, cols])
            qh = np.multiply(q[:, cols], np.float32(scale), dtype=np.float32)
            scores = np.empty((min(ATTN_BLOCK, n), n), np.float32)
            mixed = np.empty((min(ATTN_BLOCK, n), dh), np.float32)
            for q0 in range(0, n, ATTN_BLOCK):
                s, o = scores[:min(ATTN_BLOCK, n - q0)], mixed[:min(ATTN_BLOCK, n - q0)]
                self.amx.matmul(keys, qh[q0:q0 + s.shape[0]], out=s, threads=False)
                if n % LANES == 0:  # the softmax writes the halves P V reads
                    self.amx.matmul_halves(values, self.amx.softmax_split(s, values.n_ks), o, threads=False)
                else:
                    self.amx.matmul(values, ops.softmax(s, out=s), out=o, threads=False)
                heads[q0:q0 + s.shape[0], h] = o

        def head(h: int) -> None:
            keys = PanelMatrix.pack(np.ascontiguousarray(k[:, h * dh:(h + 1) * dh]), WIDE)  # [n, dh]
            values = PanelMatrix.pack(np.ascontiguousarray(v[:, h * dh:(h + 1) * dh].T))  # [dh, n]
            # scaled before QK^T (softmax(s * c) in ggml: the same up to f32 rounding), so the
            # scores take one pass fewer
            qh = np.multiply(q[:, h * dh:(h + 1) * dh], np.float32(scale), dtype=np.float32)
            scores = np.empty((min(ATTN_BLOCK, n), n), np.float32)
            for q0 in range(0, n, ATTN_BLOCK):
                s = scores[:min(ATTN_BLOCK, n - q0)]
                self.gemm.matmul(keys, qh[q0:q0 + s.shape[0]], out=s, threads=False)  # [b, n_k]
                softmax_rows(s) if n % LANES == 0 else ops.softmax(s, out=s)
                heads[q0:q0 + s.shape[0], h] = self.gemm.matmul(values, s, threads=False)  # [b, dh]

        one = head if self.amx is None else head_amx
        if self._heads is None:
            for h in range(hp.n_head):
                one(h)
        else:
            list(self._heads.map(one, range(hp.n_head)))
        return self.linear(layer.out, heads.reshape(n, hp.width), layer.out_b)

    def block(self, i: int, layer: VisionLayer, x: np.ndarray) -> np.ndarray:
        x = x + self.attention(i, layer, self.layer_norm(x, layer.ln1_w, layer.ln1_b))
        h = self.act(self.linear(layer.up, self.layer_norm(x, layer.ln2_w, layer.ln2_b), layer.up_b))
        out: np.ndarray = x + self.linear(layer.down, h, layer.down_b)
        return out

    def n_layers_run(self) -> int:
        """LLaVA's feature is the second-to-last block's output; the others run every block."""
        return self.hp.n_layer - 1 if self.hp.projector == "mlp" else self.hp.n_layer

    def vit(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [3, S, S] -> float32 [n_pos, width] (CLS included where the file has one)."""
        proj, hp = self.proj, self.hp
        if pixels.shape != (3, hp.image_size, hp.image_size):
            raise ValueError(f"pixels must be [3, {hp.image_size}, {hp.image_size}], got {pixels.shape}")
        x = self.linear(proj.patch_embd, patchify(pixels, hp.patch_size), proj.patch_bias)
        if proj.class_embd is not None:
            x = np.concatenate([x, proj.class_embd[None, :]])
        x = np.ascontiguousarray(x + proj.position_embd, dtype=np.float32)
        if proj.pre_ln is not None:
            x = layer_norm(x, *proj.pre_ln, hp.eps)
        for i, layer in enumerate(proj.layers[:self.n_layers_run()]):
            x = np.ascontiguousarray(self.block(i, layer, x), dtype=np.float32)
        if proj.post_ln is not None:
            x = layer_norm(x, *proj.post_ln, hp.eps)
        return x

    def close(self) -> None:
        if self._heads is not None:
            self._heads.shutdown()
        self.mk.close()
        if self._pool is not None:
            self._pool.close()
