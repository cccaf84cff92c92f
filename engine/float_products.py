"""x @ W.T for an encoder's float-typed weights (F32, F16) through numpy's sgemm.

At an encoder's batch sizes (thousands of rows: every text of a batch at once) OpenBLAS's
blocked sgemm runs 2-3x the engine's float-weight rows kernel, which is built for decode's few
rows (a BERT-base F16 layer's products, 1024 rows: ~65 against ~25 GFLOPS a core). The weights
are kept as float32 copies (twice an F16 file's bytes: BERT-base 440 MB, bge-small 130 MB), and
an F16 matrix's input is rounded to f16 first, as ggml converts activations to an F16 weight's
dot type. The rows of W are split over `n_threads` threads (numpy releases the GIL in BLAS;
BLAS itself runs single-threaded, engine/blas_threads.py). Quantized types stay on the
compiled kernels (engine/kernels/matmul), which read int8 dots faster than any float path.
The same threads run the encoder's row-wise numpy steps (GELU, LayerNorm) and its per-text
attention, which would otherwise leave the second core idle between matmuls.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .formats import quants
from .formats.ggml_types import GGMLQuantizationType

BLAS_TYPES = frozenset({GGMLQuantizationType.F32, GGMLQuantizationType.F16})


class FloatProducts:
    """float32 copies of the float-typed matrices given, and their products."""

    def __init__(self, matrices: list[quants.QuantMatrix], n_threads: int) -> None:
        self._f32: dict[int, np.ndarray] = {}    # id(matrix) -> float32 [n_rows, n_cols]
        self._f16_input: set[int] = set()
        for m in matrices:
            if m.qtype in BLAS_TYPES and id(m) not in self._f32:
                self._f32[id(m)] = np.ascontiguousarray(
                    quants.dequantize(m.raw, m.qtype, m.n_cols), dtype=np.float32)
                if m.qtype == GGMLQuantizationType.F16:
                    self._f16_input.add(id(m))
        self.n_threads = n_threads
        self._pool = ThreadPoolExecutor(n_threads, "modelyard-sgemm") if n_threads > 1 else None

    def covers(self, w: object) -> bool:
        return id(w) in self._f32

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._f32.values())

    def rounds_input(self, w: object) -> bool:
        """Whether w's input is rounded to f16 first (an F16 matrix)."""
        return id(w) in self._f16_input

    def matmul(self, w: object, x: np.ndarray, rounded: np.ndarray | None = None) -> np.ndarray:
        """float32 [M, n_rows] = x [M, n_cols] @ W.T; `rounded`: x already rounded to f16 (one
        rounding for the matrices sharing an input)."""
        weights = self._f32[id(w)]
        if id(w) in self._f16_input:
            x = rounded if rounded is not None else x.astype(np.float16).astype(np.float32)
        n_rows = weights.shape[0]
        if self._pool is None or n_rows < 2 * self.n_threads:
            return np.asarray(np.matmul(x, weights.T), dtype=np.float32)
        bounds = [int(b) for b in np.linspace(0, n_rows, self.n_threads + 1)]
        parts = list(self._pool.map(lambda ab: np.matmul(x, weights[ab[0]:ab[1]].T),
                                    itertools.pairwise(bounds)))
        return np.concatenate(parts, axis=1)

    def by_rows(self, fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
        """fn(x) computed on row ranges over the threads (fn row-wise; numpy's loops release
        the GIL), float32 [M, ...] like fn's."""
        M = x.shape[0]
        if self._pool is None or M < 64:
            return fn(x)
        bounds = [int(b) for b in np.linspace(0, M, self.n_threads + 1)]
        parts = list(self._pool.map(lambda ab: fn(x[ab[0]:ab[1]]), itertools.pairwise(bounds)))
        return np.concatenate(parts, axis=0)

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
        self._f32.clear()
