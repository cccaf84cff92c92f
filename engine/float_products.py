"""x @ W.T for an encoder's float-typed weights (F32, F16) on the panel GEMM.

Each group of matrices that multiplies one input (an encoder layer's Q, K and V; nomic's gate
and up) is packed once, at load, into engine.kernels.panel_gemm's layout as one matrix of their
stacked rows, in the file's own type: an F16 file's weights stay F16 (the file's pages are
released once packed, so the model costs its file's bytes, not a float32 copy's twice that),
and one GEMM reads the input once for all of them. The group's biases are stacked alike and
added to the product in place. An F16 group's input is rounded to f16 first
(engine.kernels.f16_round), as ggml converts activations to an F16 weight's dot type; the panel
GEMM then sums in f32. The GEMM splits by weight panels across the engine's native pool, so an
output's bits do not depend on the thread count. Quantized types stay on the row kernels
(engine/kernels/matmul), which read int8 dots faster than any float path.

Where the CPU has AMX-BF16 (`amx`), an F16 group is packed instead for engine.kernels.amx_gemm
(each weight as two bf16 halves, exact for an F16 value) and its input rounded to f16 inside the
split into halves (matmul_f16_input): the same f16 x f16 products but for the lo x lo term (~2^-16
of one), at several times the FMA GEMM's speed, for twice the file's bytes (added_bytes counts
them). F32 groups stay on the panel GEMM (their halves would not be exact).

The executor's threads run the encoder's row-wise steps (GELU, LayerNorm), its per-text
attention (`by_rows`, `each`) and the AMX GEMMs' chunks.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import hugepages
from .formats import quants
from .formats.ggml_types import GGMLQuantizationType
from .kernels import ops
from .kernels.amx_gemm import AmxGemm, AmxMatrix
from .kernels.f16_round import round_f16
from .kernels.panel_gemm import PanelGemm, PanelMatrix
from .kernels.pool import Pool

PANEL_TYPES = frozenset({GGMLQuantizationType.F32, GGMLQuantizationType.F16})
# the matrices an encoder layer multiplies (engine.encoder._input_groups packs them)
ENCODER_WEIGHT = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up"
                            r"|ffn_down)\.weight")
WIDE = 64  # 64-row panels: fewer broadcasts per FMA (the encoders' widths are multiples of 64)


def amx_added_bytes(tensors: dict[str, tuple[GGMLQuantizationType, int, int]]) -> int:
    """What an encoder's AMX copies add over the file (added_bytes, from its tensor table: name
    -> (type, n_rows, n_cols)): each F16 layer matrix held as two bf16 halves, rows and columns
    padded to 32, its file pages released."""
    total = 0
    for name, (qtype, rows, cols) in tensors.items():
        if qtype == GGMLQuantizationType.F16 and ENCODER_WEIGHT.fullmatch(name):
            total += 4 * (-(-rows // 32) * 32) * (-(-cols // 32) * 32) - 2 * rows * cols
    return total


class _Group:
    """One packed group: its panels and stacked bias (None when no member has one)."""

    def __init__(self, ms: list[quants.QuantMatrix], biases: list[np.ndarray | None],
                 amx: AmxGemm | None) -> None:
        dtype = np.float16 if ms[0].qtype == GGMLQuantizationType.F16 else np.float32
        rows = np.concatenate([m.raw.view(dtype).reshape(m.n_rows, m.n_cols) for m in ms])
        self.panels: PanelMatrix | AmxMatrix
        if amx is not None and dtype == np.float16:  # the compiled packer takes float32 rows
            self.panels = amx.pack_rows(rows.astype(np.float32))
        else:
            self.panels = PanelMatrix.pack(rows, WIDE)
        self.rounds_input = dtype == np.float16
        self.bias = None if all(b is None for b in biases) else np.concatenate(
            [np.zeros(m.n_rows, np.float32) if b is None else np.asarray(b, np.float32)
             for m, b in zip(ms, biases)])
        self.widths = [m.n_rows for m in ms]
        self.source_nbytes = sum(m.raw.nbytes for m in ms)


class FloatProducts:
    """Packed groups of float-typed matrices and their products; `pool` runs the panel GEMMs,
    `n_threads` executor threads the row-wise work and, with `amx` (engine.kernels.amx_gemm:
    the caller checks `available()`), the AMX GEMMs of F16 groups."""

    def __init__(self, pool: Pool, n_threads: int, amx: bool = False) -> None:
        self._groups: dict[tuple[int, ...], _Group] = {}
        self.gemm = PanelGemm(pool=pool)
        self.n_threads = n_threads
        self._pool = ThreadPoolExecutor(n_threads, "modelyard-encoder") if n_threads > 1 else None
        self.amx = AmxGemm(self._pool, n_threads) if amx else None

    def pack(self, pairs: list[tuple[quants.QuantMatrix, np.ndarray | None]],
             file_backed: bool = True) -> bool:
        """Pack (W, bias) pairs sharing an input as one group if they are all of one float type
        (else each alone where it is one); whether the whole group was packed together."""
        ms = [m for m, _ in pairs]
        if len({m.qtype for m in ms}) == 1 and ms[0].qtype in PANEL_TYPES:
            self._groups[tuple(id(m) for m in ms)] = _Group(ms, [b for _, b in pairs], self.amx)
            if file_backed:
                for m in ms:
                    hugepages.release_file_pages(m.raw)
            return True
        if len(pairs) > 1:
            for pair in pairs:
                self.pack([pair], file_backed)
        return False

    def covers(self, ms: list[quants.QuantMatrix]) -> bool:
        return tuple(id(m) for m in ms) in self._groups

    @property
    def added_bytes(self) -> int:
        """What the packed copies add over their sources (whose file pages are released): the
        zero rows padding a panel, nothing for widths of 64 rows; an AMX copy of F16 weights
        holds 4 bytes a weight (two bf16 halves), twice the file's."""
        return sum(g.panels.data.nbytes - g.source_nbytes for g in self._groups.values())

    def matmul(self, ms: list[quants.QuantMatrix], x: np.ndarray) -> list[np.ndarray]:
        """[x @ W.T + b for each W of the packed group `ms`]: float32 [M, n_rows] column views
        of one product (the whole product when the group is one matrix)."""
        g = self._groups[tuple(id(m) for m in ms)]
        x = np.ascontiguousarray(x, dtype=np.float32)
        if isinstance(g.panels, AmxMatrix):  # F16 on AMX: rounded to f16 in the split
            assert self.amx is not None
            out = self.amx.matmul_f16_input(g.panels, x)
        else:
            if g.rounds_input:
                x = self.by_rows(lambda xs, out: round_f16(xs, out=out), x)
            out = self.gemm.matmul(g.panels, x)
        if g.bias is not None:
            self.by_rows(lambda xs, o: ops.add_bias(xs, g.bias, out=o), out, out)  # type: ignore[arg-type]
        if len(g.widths) == 1:
            return [out]
        edges = list(itertools.accumulate([0] + g.widths))
        return [out[:, a:b] for a, b in itertools.pairwise(edges)]

    def by_rows(self, fn: Callable[[np.ndarray, np.ndarray], object], x: np.ndarray,
                out: np.ndarray | None = None) -> np.ndarray:
        """fn(x_rows, out_rows) on blocks of rows over the threads (fn row-wise, writing its
        block of `out`; numpy and the compiled kernels release the GIL); returns out (new, x's
        shape, unless given; may be x)."""
        if out is None:
            out = np.empty_like(x)
        M = x.shape[0]
        if self._pool is None or M < 64:
            fn(x, out)
            return out
        step = -(-M // (2 * self.n_threads))
        list(self._pool.map(lambda a: fn(x[a:a + step], out[a:a + step]), range(0, M, step)))
        return out

    def each(self, fn: Callable[[int], None], n: int) -> None:
        """fn(i) for i < n over the threads (fn writes disjoint rows)."""
        if self._pool is None or n < 2:
            for i in range(n):
                fn(i)
            return
        list(self._pool.map(fn, range(n)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._groups.clear()
