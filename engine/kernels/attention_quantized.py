"""Compiled attention over a quantized KV cache (q8_0 / q4_0 rows, engine.kv_types): one
function per (key type, value type, head_dim), built on first use (engine.kernels.attention_ir.quantized);
its twin is engine.kernels.attention_quantized_reference. Causal, with a sliding window and a
ring as engine.kv lays them out; no softcap, sinks or bidirectional spans yet. The forward
pass's graph calls the same functions through engine.kernels.kvq_tasks (`address`), so the fused
and the eager pass give the same bits.
"""
from __future__ import annotations

import ctypes
import math
import operator
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from engine.kernels.attention_ir.quantized import (
    build_quantized_module,
    function_name,
    scratch_floats,
)
from engine.kernels.ir import builder
from engine.kernels.jit import compile_cached, host_has
from engine.kv_types import KVType


class QuantizedAttentionKernel:
    """attention(q, k_rows, v_rows, pos0) for one pair of quantized KV types. With n_threads > 1
    a call's items are split by their key counts over that many threads (ctypes drops the GIL
    during each part; items are independent, so the bits do not depend on the split)."""

    def __init__(self, type_k: KVType, type_v: KVType, n_threads: int = 1) -> None:
        if not (type_k.quantized and type_v.quantized):
            raise ValueError(f"a quantized kernel takes q8_0/q4_0 keys and values, got "
                             f"{type_k.name}/{type_v.name}")
        self.type_k, self.type_v = type_k, type_v
        self.registers = 32 if host_has("avx512f") else 16  # the code's plan, never a bit
        self._fns: dict[int, tuple[Callable[..., None], int]] = {}
        self.n_threads = n_threads
        self._threads = ThreadPoolExecutor(n_threads - 1) if n_threads > 1 else None

    def _function(self, head_dim: int) -> tuple[Callable[..., None], int]:
        """(callable, address) of the function for head_dim, compiled (or loaded) once."""
        got = self._fns.get(head_dim)
        if got is None:
            tk, tv = self.type_k.name, self.type_v.name
            lib = compile_cached("attention_quantized", (tk, tv, head_dim, self.registers), lambda: str(
                build_quantized_module(tk, tv, head_dim, self.registers)))
            p, n, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
            name = function_name(tk, tv, head_dim)
            got = self._fns[head_dim] = (lib.function(name, None, p, p, p, p, p, n, n, n, n, n, f, n, n, n, n),
                                         lib.address(name))
        return got

    def address(self, head_dim: int) -> int:
        """The compiled function for rows of head_dim (the graph's attention task calls it)."""
        return self._function(head_dim)[1]

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown()
            self._threads = None

    def split(self, n_q: int, n_head: int, pos0: int, window: int) -> list[int]:
        """Item boundaries [0, .., n_q * n_head] giving each thread about the same key rows."""
        keys = np.arange(pos0 + 1, pos0 + n_q + 1)
        if window:
            keys = np.minimum(keys, window)
        cost = np.cumsum(np.repeat(keys, n_head))                               # [items]
        parts = [int(np.searchsorted(cost, cost[-1] * i / self.n_threads)) for i in
                 range(1, self.n_threads)]
        return [0, *parts, n_q * n_head]

    def __call__(self, q: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray, pos0: int, *,
                 scale: float | None = None, window: int = 0, ring: int | None = None) -> np.ndarray:
        """q float32 [n_q, n_head, head_dim] at positions pos0..; k_rows / v_rows uint8
        [rows, n_kv_head, row_bytes(head_dim)] -> float32 [n_q, n_head, head_dim]."""
        n_q, n_head, head_dim = q.shape
        pos0, window = operator.index(pos0), operator.index(window)
        ring = k_rows.shape[0] if ring is None else operator.index(ring)
        n_kv_head = k_rows.shape[1]
        for rows, t, what in ((k_rows, self.type_k, "k_rows"), (v_rows, self.type_v, "v_rows")):
            want = (n_kv_head, t.row_bytes(head_dim))
            if rows.dtype != np.uint8 or rows.shape[1:] != want or not rows.flags.c_contiguous:
                raise ValueError(f"{what} must be C-contiguous uint8 [rows, {want[0]}, {want[1]}]")
        if not (q.dtype == np.float32 and q.flags.c_contiguous and n_head % n_kv_head == 0):
            raise ValueError("q must be C-contiguous float32 [n_q, n_head, head_dim], n_head a "
                             "multiple of the kv heads")
        if pos0 + n_q > ring and (window == 0 or k_rows.shape[0] < ring + window - 1):
            raise ValueError("the queries' keys do not fit the cache rows")
        out = np.empty_like(q)
        scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        bounds = self.split(n_q, n_head, pos0, window) if self._threads is not None else [0, n_q * n_head]
        scratch = np.empty((len(bounds) - 1, scratch_floats(head_dim)), np.float32)
        fn = self._function(head_dim)[0]

        def part(i: int) -> None:
            fn(builder.address(q), builder.address(k_rows), builder.address(v_rows),
                     builder.address(out), scratch[i].ctypes.data, n_q, n_head, n_kv_head,
                     head_dim, pos0, scale, bounds[i], bounds[i + 1], window, ring)

        others = [self._threads.submit(part, i) for i in range(1, len(bounds) - 1)] \
            if self._threads is not None else []
        part(0)
        for f in others:
            f.result()
        return out
