"""Encoders (bert, nomic-bert): a batch of texts through the family's encoder block at once.

    texts (whole, each from position 0) -> rows concatenated, x [T, n_embd]:
        x = layer_norm(token_embd[ids] + token_types[0] (+ position_embd[pos])) * w + b
        each layer: engine/arch/bert.py's encoder_block on this pass (EncoderOps):
            projections on the engine's compiled matmul kernels (quantized types, repacked
            where they want it) or the panel GEMM (F32/F16 packed in their own type, Q/K/V as
            one product: engine/float_products.py), every text's rows together, so the weights
            are read once per batch;
            attention per text and head in float32, every row seeing every row of its text
            (llama.cpp's embedding contexts run without the flash path: f32 q.k, softmax, v):
            scores and values on the panel GEMM, engine/kernels/row_softmax between, queries
            blocked by ATTN_BLOCK; texts spread over the threads;
            LayerNorm (engine/kernels/layer_norm; its numpy twin `layer_norm` for widths off
            16 lanes), GELU (engine/kernels/gelu_table) and SwiGLU compiled, by blocks of rows
    -> each text's final rows [n_i, n_embd], which engine.pooling turns into vectors or scores

GELU as llama.cpp's CPU computes it (GGML_GELU_FP16): x rounded to f16 indexes a table of
f16(gelu(x)); below -10 it is 0, above 10 x. gelu_f16 does the same from gelu_f16_table (the
numpy twin of engine/kernels/gelu_table, which reads the same table).

EncoderTransformer meets engine.loaded's Forward, so the batch runner and the server's scheduler
treat an encoder as any model: a chunk is one whole text in a slot (`whole_prompts`), and
`cache` keeps nothing (an encoder has no KV cache: nothing is reused between requests).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from .arch.bert import BertLayer
from .float_products import PANEL_TYPES, FloatProducts
from .formats import quants
from .formats.repack import RepackedMatrix
from .gguf import GGUFFile, ModelLoadError
from .hparams import HParams
from .kernels import amx_gemm, ops, rotary
from .kernels.gelu_table import gelu_table
from .kernels.layer_norm import LANES as NORM_LANES
from .kernels.layer_norm import layer_norm_rows
from .kernels.matmul import MatmulKernels
from .kernels.panel_gemm import PanelMatrix
from .kernels.pool import Pool
from .kernels.row_softmax import LANES as SOFTMAX_LANES
from .kernels.row_softmax import softmax_rows
from .model import Chunk, ContextOverflowError
from .weights import RankHead, _TensorReader, check_all_used, read_rank_head

_F32 = np.float32
ATTN_BLOCK = 192  # queries per attention block: a long text's scores stay [192, n] per head
WIDE = 64         # the keys' panel width (values: the default 32, N = head size)
_SQRT_2_OVER_PI = _F32(0.79788456080286535587989211986876)
_GELU_COEF_A = _F32(0.044715)


def gelu_f32(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_f32 in float32, its operations in C's order: 0.5x(1 + tanh(s x (1 + a x x)))."""
    x = x.astype(_F32)
    inner = (_SQRT_2_OVER_PI * x) * (_F32(1) + (_GELU_COEF_A * x) * x)
    return np.asarray((_F32(0.5) * x) * (_F32(1) + np.tanh(inner)), dtype=_F32)


_TABLE: np.ndarray | None = None


def gelu_f16_table() -> np.ndarray:
    """float32 [65536]: f16(gelu(h)) for every f16 bit pattern h (ggml_table_gelu_f16)."""
    global _TABLE
    if _TABLE is None:
        h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(_F32)
        with np.errstate(all="ignore"):
            _TABLE = gelu_f32(h).astype(np.float16).astype(_F32)
    return _TABLE


def gelu_f16(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: the table at f16(x); 0 below -10, x above 10."""
    with np.errstate(over="ignore"):  # |x| beyond f16's range: the ends below decide
        idx = x.astype(np.float16).view(np.uint16)
    y = np.where(x >= 10.0, x, gelu_f16_table()[idx])
    y[x <= -10.0] = 0.0
    return np.asarray(y, dtype=_F32)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """ggml_norm (sums in double, 1/sqrtf(var + eps)) then * weight + bias, per row."""
    centred = (x - x.mean(axis=-1, keepdims=True, dtype=np.float64).astype(_F32)).astype(_F32)
    var = np.square(centred).mean(axis=-1, keepdims=True, dtype=np.float64)
    scale = (_F32(1) / np.sqrt((var + eps).astype(_F32))).astype(_F32)
    return np.asarray((centred * scale) * weight + bias, dtype=_F32)


@dataclasses.dataclass
class EncoderWeights:
    token_embd: quants.QuantMatrix      # [n_vocab, n_embd]
    type_row: np.ndarray | None         # float32 [n_embd] token_types row 0 (llama.cpp's)
    position_embd: np.ndarray | None    # float32 [n_ctx_train, n_embd] bert's learned positions
    embd_norm: np.ndarray               # float32 [n_embd] token_embd_norm
    embd_norm_b: np.ndarray             # float32 [n_embd]
    layers: list[BertLayer]
    rank_head: RankHead | None

    def matrices(self) -> list[quants.QuantMatrix]:
        out = [self.token_embd]
        for layer in self.layers:
            out += layer.matrices()
        return out


def load_encoder_weights(f: Any, hp: HParams) -> EncoderWeights:
    """The encoder's tensors, every one of the file's used (as engine.weights.load_weights)."""
    spec, read = hp.spec, _TensorReader(f, hp)
    layers: list[BertLayer] = [spec.layer(**read.walk(spec.tensors, f"blk.{i}."))
                               for i in range(hp.n_layer)]
    token_embd = read.matrix("token_embd.weight", hp.n_embd, hp.n_vocab)
    type_row = None
    types = f.tensors.get("token_types.weight")
    if types is not None:
        if len(types.shape) != 2 or types.shape[0] != hp.n_embd:
            raise ModelLoadError(read.path, f"tensor token_types.weight has shape {list(types.shape)}")
        type_row = read.floats("token_types.weight", tuple(types.shape))[0].copy()
    position_embd = None
    if spec.positions == "learned":
        position_embd = read.floats("position_embd.weight", (hp.n_embd, hp.n_ctx_train))
    embd_norm = read.vector("token_embd_norm.weight", hp.n_embd)
    embd_norm_b = read.vector("token_embd_norm.bias", hp.n_embd)
    weights = EncoderWeights(token_embd, type_row, position_embd, embd_norm, embd_norm_b, layers,
                             read_rank_head(read))
    check_all_used(read)
    return weights


def _input_groups(w: BertLayer) -> list[list[tuple[quants.QuantMatrix, np.ndarray | None]]]:
    """The layer's (matrix, bias) groups sharing an input, as encoder_block projects them."""
    up = [(w.w_up, w.b_up)] if w.w_gate is None else [(w.w_gate, None), (w.w_up, w.b_up)]
    return [[(w.wq, w.bq), (w.wk, w.bk), (w.wv, w.bv)], [(w.wo, w.bo)], up, [(w.w_down, w.b_down)]]


def _head_panels(x: np.ndarray, H: int, hd: int, values: bool = False) -> list[PanelMatrix]:
    """One text's keys [n, H hd] as each head's panel matrix [n, hd] (WIDE rows a panel), or
    with `values` its values as each head's [hd, n] (32 rows a panel): all heads in one copy,
    laid out as PanelMatrix.pack lays out one (panel_gemm.pack_panels)."""
    n = x.shape[0]
    if values:  # W = V_h^T: panel p holds rows 32p.. of W, i.e. columns of V_h, k-major = by n
        if hd % 32:
            return [PanelMatrix.pack(np.ascontiguousarray(x[:, h * hd:(h + 1) * hd].T))
                    for h in range(H)]
        data = np.ascontiguousarray(x.reshape(n, H, hd // 32, 32).transpose(1, 2, 0, 3))
        return [PanelMatrix(data[h], hd, n) for h in range(H)]
    n_p = -(-n // WIDE)
    padded = np.zeros((n_p * WIDE, H * hd), _F32)
    padded[:n] = x
    data = np.ascontiguousarray(padded.reshape(n_p, WIDE, H, hd).transpose(2, 0, 3, 1))
    return [PanelMatrix(data[h], n, hd) for h in range(H)]


class _NoCache:
    """engine.loaded's SlotCache for a model without one: every slot holds nothing."""

    nbytes = 0

    def __init__(self, n_slots: int) -> None:
        self.tokens: list[list[Any]] = [[] for _ in range(n_slots)]

    def reusable(self, slot: int, n: int) -> int:
        return 0

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Nothing to copy."""

    def truncate(self, slot: int, n: int) -> None:
        del self.tokens[slot][n:]


class _Pass:
    """One forward over a batch of texts: EncoderOps on named float32 rows [T, ...]."""

    def __init__(self, tr: EncoderTransformer, x: np.ndarray, spans: list[tuple[int, int]],
                 positions: np.ndarray) -> None:
        self.tr, self.hp = tr, tr.hp
        self.floats = tr.float_products
        self.spans, self.positions = spans, positions
        self.bufs: dict[str, np.ndarray] = {"x": x}

    def project(self, src: str,
                targets: list[tuple[quants.QuantMatrix, np.ndarray | None, str]]) -> None:
        x, floats = self.bufs[src], self.floats
        ms = [w for w, _, _ in targets]
        if floats.covers(ms):  # one panel GEMM for the group, biases added
            for (_, _, dst), out in zip(targets, floats.matmul(ms, x)):
                self.bufs[dst] = out
            return
        for w, bias, dst in targets:
            out = (floats.matmul([w], x)[0] if floats.covers([w])
                   else self.tr.matmul_kernels.matmul(w, x))
            if bias is not None and not floats.covers([w]):
                ops.add_bias(out, bias, out=out)
            self.bufs[dst] = out

    def rope(self) -> None:
        hp, T = self.hp, self.positions.shape[0]
        for name in ("q", "k"):
            x = np.ascontiguousarray(self.bufs[name]).reshape(T, -1, hp.head_dim)
            self.bufs[name] = rotary.rope(x, self.positions, hp.n_rot, self.tr.rope_spec,
                                          neox=True).reshape(T, -1)

    def attention(self) -> None:
        hp = self.hp
        H, hd = hp.n_head, hp.head_dim
        q, k, v = self.bufs["q"], self.bufs["k"], self.bufs["v"]
        out = np.empty((q.shape[0], H * hd), _F32)
        scale = _F32(hp.scale())
        gemm = self.floats.gemm

        def one(i: int) -> None:  # a text's heads on this thread, each blocked by queries
            a, b = self.spans[i]
            n = b - a
            # softmax(s c) as softmax of (q c) k: the scores take one pass fewer
            qh = np.empty((H, n, hd), _F32)
            np.multiply(q[a:b].reshape(n, H, hd).transpose(1, 0, 2), scale, out=qh)
            keys, values = _head_panels(k[a:b], H, hd), _head_panels(v[a:b], H, hd, values=True)
            heads = np.empty((H, n, hd), _F32)
            scores = np.empty((min(ATTN_BLOCK, n), n), _F32)
            for h in range(H):
                for q0 in range(0, n, ATTN_BLOCK):
                    s = scores[:min(ATTN_BLOCK, n - q0)]
                    gemm.matmul(keys[h], qh[h, q0:q0 + s.shape[0]], out=s, threads=False)
                    softmax_rows(s) if n % SOFTMAX_LANES == 0 else ops.softmax(s, out=s)
                    gemm.matmul(values[h], s, out=heads[h, q0:q0 + s.shape[0]], threads=False)
            out[a:b] = heads.transpose(1, 0, 2).reshape(n, H * hd)

        self.floats.each(one, len(self.spans))           # texts over the threads
        self.bufs["q"] = out

    def residual_norm(self, weight: np.ndarray, bias: np.ndarray) -> None:
        eps = self.hp.rms_eps
        x, o = self.bufs["x"], np.ascontiguousarray(self.bufs["o"])
        compiled = x.shape[1] % NORM_LANES == 0  # else the numpy twin

        def rows(xs: np.ndarray, out: np.ndarray) -> None:
            a = (xs.ctypes.data - x.ctypes.data) // x.strides[0]
            np.add(xs, o[a:a + xs.shape[0]], out=xs)
            if compiled:
                layer_norm_rows(xs, weight, bias, eps, out=out)
            else:
                out[:] = layer_norm(xs, weight, bias, eps)

        self.bufs["x"] = self.floats.by_rows(rows, x, x)

    def gelu(self, buf: str) -> None:
        g, table = np.ascontiguousarray(self.bufs[buf]), gelu_f16_table()
        if g.shape[1] % 16:  # the numpy twin for widths the 16-lane kernel does not take
            self.bufs[buf] = self.floats.by_rows(lambda xs, out: out.__setitem__(
                slice(None), gelu_f16(xs)), g, g)
            return
        self.bufs[buf] = self.floats.by_rows(lambda xs, out: gelu_table(xs, table, out=out), g, g)

    def glu(self) -> None:
        g, u = np.ascontiguousarray(self.bufs["g"]), np.ascontiguousarray(self.bufs["u"])
        self.bufs["g"] = ops.silu_mul(g, u)


class EncoderTransformer:
    """Weights + matmul kernels of an encoder; evaluates batches of whole texts. One caller."""

    whole_prompts = True  # a chunk is a whole text from position 0 (the batch runner's cue)

    def __init__(self, f: GGUFFile, hp: HParams, n_ctx: int, n_slots: int, n_threads: int,
                 amx: bool | None = None) -> None:
        """amx: F16 projections on AMX tiles (engine.float_products); None: wherever the CPU and
        OS have them, False: the FMA panel GEMM everywhere. Attention stays on the panel GEMM
        (its per-head products of 128-token texts ran slower on AMX: more packing per head)."""
        assert hp.spec.encoder_block is not None
        self.hp = hp
        self.n_ctx = n_ctx if hp.spec.positions != "learned" else min(n_ctx, hp.n_ctx_train)
        self.weights = load_encoder_weights(f, hp)
        self.block = hp.spec.encoder_block
        self.pool = Pool(n_threads)
        try:
            self.matmul_kernels = MatmulKernels({m.qtype for m in self.weights.matrices()},
                                                pool=self.pool)
            self.float_products = FloatProducts(
                self.pool, n_threads, amx=amx_gemm.available() if amx is None else amx)
            for layer in self.weights.layers:  # float groups packed; the rest repacked or kept
                for group in _input_groups(layer):
                    self.float_products.pack(group)
            mk, floats = self.matmul_kernels, self.float_products
            self.weights.layers = [layer.with_matrices(
                lambda m: m if floats.covers([m]) or m.qtype in PANEL_TYPES
                else mk.prepare(m, file_backed=True)) for layer in self.weights.layers]
        except BaseException:
            self.pool.close()
            raise
        self.rope_spec = rotary.RopeSpec(hp.rope_base, freq_scale=hp.rope_freq_scale)
        self.cache = _NoCache(n_slots)
        self.lora_bytes = 0  # no adapters on an encoder (engine.api refuses them)

    @property
    def repacked_bytes(self) -> int:
        """Bytes the repacked and packed copies add to the mapping (their sources' pages are
        released)."""
        return self.float_products.added_bytes + sum(
            m.nbytes - m.source.nbytes for m in self.weights.matrices()
            if isinstance(m, RepackedMatrix))

    def token_rows(self, ids: np.ndarray) -> np.ndarray:
        te = self.weights.token_embd
        return quants.dequantize(te.raw[ids], te.qtype, te.n_cols)

    def encode(self, texts: list[list[int]]) -> list[np.ndarray]:
        """Each text's final hidden states, float32 [n_i, n_embd], all texts in one pass."""
        if not texts or any(not t for t in texts):
            raise ValueError("nothing to encode: an empty text")
        for t in texts:
            if len(t) > self.n_ctx:
                raise ContextOverflowError(len(t), self.n_ctx)
        ids = np.concatenate([np.asarray(t, np.int64) for t in texts])          # [T]
        if ((ids < 0) | (ids >= self.hp.n_vocab)).any():
            raise ValueError(f"token ids must be in 0..{self.hp.n_vocab - 1}")
        positions = np.concatenate([np.arange(len(t), dtype=np.int64) for t in texts])
        w = self.weights
        x = self.token_rows(ids)                                                # [T, n_embd]
        if w.type_row is not None:
            x += w.type_row
        if w.position_embd is not None:
            x = w.position_embd[positions] + x
        x = layer_norm(x, w.embd_norm, w.embd_norm_b, self.hp.rms_eps)
        bounds = np.cumsum([0] + [len(t) for t in texts])
        spans = [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]
        p = _Pass(self, np.ascontiguousarray(x, dtype=_F32), spans, positions)
        for li, layer in enumerate(w.layers):
            self.block(p, layer, li)
        x = p.bufs["x"]
        return [x[a:b].copy() for a, b in spans]

    def forward(self, chunks: list[Chunk], output: str = "hidden") -> list[np.ndarray]:
        """engine.loaded's Forward: each chunk a whole text at position 0; `hidden` only."""
        if output != "hidden":
            raise ValueError("an encoder gives hidden states, not logits: it embeds, it does not "
                             "generate")
        for c in chunks:
            if c.pos0 != 0 or c.prompt.has_embeddings:
                raise ValueError("an encoder takes each text whole, as token ids, from position 0")
        return self.encode([c.prompt.token_ids() for c in chunks])

    def close(self) -> None:
        if self.pool is not None:
            self.float_products.close()
            self.matmul_kernels.close()
            self.pool.close()
            self.pool = None  # type: ignore[assignment]
        self.weights = None  # type: ignore[assignment]
