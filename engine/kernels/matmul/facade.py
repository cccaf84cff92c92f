"""MatmulKernels, the runtime facade: compiles one module per weight type (build.py), keeps the
activation scratch buffer, and splits big matmuls across a thread pool by weight rows.

    out[m, r] = dot(W[r, :], x[m, :])      W: QuantMatrix [N, K]   x: float32 [M, K]   out: [M, N]

Each call quantizes the activations once (quantize_<act>), then runs rows_<type> over all
weight rows, on this thread (the fused matmul_<type>) or split across the pool (task_matmul).
Model graphs skip this class's call path: they take TypeKernels' addresses into their task
graph (engine/model.py). Where an M > 1 kernel (a GEMM over several weight rows at once) plugs
in: TypeKernels gets its function and MatmulKernels.matmul picks it by M; the per-type record
(engine.formats.quants.TYPES) and the activation quantizer stay as they are.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from engine import hugepages
from engine.formats.activations import (
    ACTIVATION_BLOCK,
    empty_packed,
    packed_activation_bytes,
)
from engine.formats.ggml_types import GGMLQuantizationType
from engine.formats.quants import SUPPORTED, QuantMatrix, StackedMatrix, quant_type
from engine.formats.repack import RepackedMatrix, RepackedStack, can_repack, repack_stack
from engine.kernels import jit, tasks
from engine.kernels.gemm.facade import GemmKernels, GemmTypeKernels
from engine.kernels.ir.builder import address
from engine.kernels.matmul.build import build_matmul_ir
from engine.kernels.matmul.loops import NARROW_TILES, TILES
from engine.kernels.pool import Pool

_F32 = np.dtype(np.float32)
_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p


# A split across the pool costs a dispatch (~2 us) and a barrier: worth it from ~256 KB of
# weight reads (about 15 us of one thread's work).
MIN_SPLIT_BYTES = 256 << 10


@dataclass(frozen=True)
class TypeKernels:
    """One weight type's compiled functions, as ctypes calls and as addresses (for task graphs)."""
    act: str | None
    block_elems: int
    rows: Callable[..., None]  # rows_<type>(w, x or xq, out, nb or K, r0, r1, M, N)
    fused: Callable[..., None] | None  # matmul_<type>(w, x, xq, out, nb, M, N)
    quantize: Callable[..., None] | None  # quantize_<act>(x, xq, nb, r0, r1, M)
    rows_address: int
    quantize_address: int  # 0 for float types

    def act_bytes(self, n_cols: int, m_rows: int) -> int:
        """Bytes of m_rows rows of activations as the rows kernel takes them (f32 for float types)."""
        if self.act is None:
            return 4 * n_cols * m_rows
        return packed_activation_bytes(self.act, n_cols, m_rows)


class MatmulKernels:
    """Compiled matmul kernels for a set of weight types; see the module docstring.

    Everything is compiled (or loaded from the disk cache) in the constructor, never later.
    Calls are serialized per instance (they share the activation scratch buffer and workers).
    Big matmuls are split by weight rows across `pool` (or a pool of n_threads of its own).
    """

    def __init__(self, qtypes: Iterable[GGMLQuantizationType], n_threads: int = 1,
                 portable: bool = False, pool: Pool | None = None, vnni: bool | None = None,
                 wide: bool | None = None, interleaved: bool = True) -> None:
        wanted = set(qtypes)
        for q in wanted:
            if q not in SUPPORTED:
                raise ValueError(f"unsupported tensor type {getattr(q, 'name', q)}")
        if n_threads < 1:
            raise ValueError(f"n_threads must be at least 1, got {n_threads}")
        self.portable = portable or not jit.host_has("avx2")
        # VNNI (AVX-512 VL or AVX-VNNI): one vpdpbusd for the u8 x s8 dot products
        host_vnni = jit.host_has("avxvnni") or (jit.host_has("avx512vnni") and jit.host_has("avx512vl"))
        self.vnni = not self.portable and host_vnni and vnni is not False
        # AVX-512 (byte ops, 512-bit vpdpbusd): pairs of activation rows share a register
        host_wide = all(jit.host_has(x) for x in ("avx512f", "avx512bw", "avx512vl", "avx512vnni"))
        self.wide = self.vnni and host_wide and wide is not False
        self.tiles = TILES if jit.host_has("avx512vl") and not self.portable else NARROW_TILES
        self._kernels = {q: self._load(q) for q in sorted(wanted, key=lambda t: t.value)}
        # the row-interleaved kernels (engine.kernels.gemm) for the types they cover on this ISA
        isa = "portable" if self.portable else "vnni512" if self.wide else "avx2"
        self._gemm = GemmKernels(wanted, isa) if interleaved else None
        self._own_pool = pool is None and n_threads > 1
        self._pool = Pool(n_threads) if self._own_pool else pool
        self.n_threads = self._pool.n_threads if self._pool is not None else 1
        # the task that splits a matmul across the pool, compiled now rather than at the first split
        self._split_task = (tasks.load_tasks(jit.host_has("f16c")).address["task_matmul"]
                            if self._pool is not None else 0)
        self._step = np.zeros(len(tasks.STEP.fields), np.int64)  # a STEP block: n_tokens is M
        self._step_address = address(self._step)
        self._lock = threading.Lock()
        self._scratch = np.empty(0, np.uint8)
        self._scratch_address = 0
        # where repacked copies go: one model's arena on huge pages (when a Transformer owns
        # this instance), else a populated mapping of their own each
        self._alloc = hugepages.Arena().take if hugepages.available() else hugepages.anonymous

    def _load(self, qtype: GGMLQuantizationType) -> TypeKernels:
        lib = jit.compile_cached("matmul", (qtype.name, self.portable, self.vnni, self.tiles, self.wide),
                                 lambda: build_matmul_ir(qtype, self.portable, self.vnni, self.tiles,
                                                         self.wide))
        name = qtype.name.lower()
        t = quant_type(qtype)
        act = t.act
        rows = lib.function(f"rows_{name}", None, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64)
        rows_address = lib.address(f"rows_{name}")
        if act is None:
            return TypeKernels(None, 1, rows, None, None, rows_address, 0)
        fused = lib.function(f"matmul_{name}", None, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64)
        quantize = lib.function(f"quantize_{act}", None, _PTR, _PTR, _I64, _I64, _I64, _I64)
        return TypeKernels(act, t.block_elems, rows, fused, quantize, rows_address,
                           lib.address(f"quantize_{act}"))

    def repacks(self, w: QuantMatrix) -> bool:
        """Whether prepare(w) gives a repacked copy (the interleaved kernels cover its type and
        shape on this instance)."""
        return (self._gemm is not None and self._gemm.runs_in_models(w.qtype)
                and can_repack(w.qtype, w.n_rows, w.n_cols))

    def prepare(self, w: QuantMatrix, file_backed: bool = False) -> QuantMatrix | RepackedMatrix:
        """The matrix in the layout this instance computes it fastest in: repacked for the
        row-interleaved kernels where they cover it (repacks), on huge pages where the host has
        them (engine.hugepages), else `w` itself. With `file_backed` (w views a read-only file
        mapping) a repacked source's pages are released."""
        if not self.repacks(w):
            return w
        assert self._gemm is not None
        packed = self._gemm.repack(w, self._alloc)
        if file_backed:
            hugepages.release_file_pages(w.raw)
        return packed

    def prepare_stack(self, stack: StackedMatrix,
                      file_backed: bool = False) -> StackedMatrix | RepackedStack:
        """A mixture's stacked experts as prepare gives one matrix: every expert repacked, one
        after another (so each chosen expert's rows stream through the interleaved kernels
        as the dense matrices' do), or `stack` itself."""
        if not self.repacks(stack.matrix(0)):
            return stack
        gemm = self._gemm
        assert gemm is not None
        packed = repack_stack(stack, gemm.repack, self._alloc)
        if file_backed:
            hugepages.release_file_pages(stack.raw)
        return packed

    def kernels_for(self, w: QuantMatrix | RepackedMatrix) -> TypeKernels | GemmTypeKernels:
        """The kernels that take `w` in its layout (see prepare)."""
        if isinstance(w, RepackedMatrix):
            if self._gemm is None:
                raise ValueError("this instance was built without the interleaved kernels")
            return self._gemm.kernels(w.qtype)
        return self.kernels(w.qtype)

    def kernels(self, qtype: GGMLQuantizationType) -> TypeKernels:
        k = self._kernels.get(qtype)
        if k is None:
            raise ValueError(f"no kernel compiled for {qtype.name}; this instance has "
                             f"{', '.join(sorted(t.name for t in self._kernels))}")
        return k

    def _scratch_for(self, nbytes: int) -> int:
        if self._scratch.nbytes < nbytes:
            self._scratch = empty_packed(max(nbytes, 2 * self._scratch.nbytes))
            self._scratch_address = int(self._scratch.ctypes.data)
        return self._scratch_address

    @staticmethod
    def _activations(x: np.ndarray, n_cols: int) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise ValueError(f"activations must be a numpy array, got {type(x).__name__}")
        if x.ndim != 2 or x.shape[1] != n_cols or x.shape[0] < 1:
            raise ValueError(f"activations must have shape [M >= 1, {n_cols}], got {x.shape}")
        if x.dtype != _F32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        return x

    def matmul(self, w: QuantMatrix | RepackedMatrix, x: np.ndarray,
               out: np.ndarray | None = None) -> np.ndarray:
        """out[m, r] = dot(W[r, :], x[m, :]) for x float32 [M, K]; returns float32 [M, N]."""
        k = self.kernels_for(w)
        x = self._activations(x, w.n_cols)
        m, n = x.shape[0], w.n_rows
        if out is None:
            out = np.empty((m, n), _F32)
        elif (not isinstance(out, np.ndarray) or out.shape != (m, n) or out.dtype != _F32
              or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"out must be a writable C-contiguous float32 array of shape {(m, n)}")
        x_addr, out_addr = address(x), address(out)
        with self._lock:
            split = (self._pool is not None and self.n_threads > 1 and n > 1
                     and w.nbytes * m >= MIN_SPLIT_BYTES)
            if k.act is None:  # float weights: x goes in as is; "blocks" are values
                if not split:
                    k.rows(w.address, x_addr, out_addr, w.n_cols, 0, n, m, n)
                    return out
                self._run_split(k, w, x_addr, out_addr, w.n_cols, m)
                return out
            nb = w.n_cols // k.block_elems
            xq = self._scratch_for(k.act_bytes(w.n_cols, m))
            if not split and k.fused is not None:
                k.fused(w.address, x_addr, xq, out_addr, nb, m, n)
            elif not split:
                assert k.quantize is not None
                k.quantize(x_addr, xq, nb, 0, m, m)
                k.rows(w.address, xq, out_addr, nb, 0, n, m, n)
            else:
                assert k.quantize is not None
                k.quantize(x_addr, xq, nb, 0, m, m)
                self._run_split(k, w, xq, out_addr, nb, m)
        return out

    def _run_split(self, k: TypeKernels | GemmTypeKernels, w: QuantMatrix | RepackedMatrix,
                   x_addr: int, out_addr: int, nb: int,
                   m: int) -> None:
        assert self._pool is not None
        tasks.STEP.fill(self._step, n_tokens=m)
        args = tasks.MATMUL.pack(fn=k.rows_address, w=w.address, x=x_addr, out=out_addr, nb=nb,
                                 n_rows=w.n_rows, m_at=tasks.M_TOKENS)
        self._pool.run_task(self._split_task, args, self._step_address)

    def quantize(self, x: np.ndarray, act: str, r0: int = 0, r1: int | None = None,
                 into: np.ndarray | None = None) -> np.ndarray:
        """The compiled activation quantizer (for tests): rows [r0, r1) of x, float32 [M, K],
        into `into` (or a fresh zeroed buffer): uint8 [M * packed row bytes], laid out as
        engine.formats.quants.pack_activations."""
        quantizers = {k.act: k.quantize for k in self._kernels.values() if k.act is not None}
        fn = quantizers.get(act)
        if fn is None:
            raise ValueError(f"no {act} quantizer compiled here (have {sorted(quantizers)})")
        if not isinstance(x, np.ndarray) or x.ndim != 2:
            raise ValueError("activations must be a 2-D numpy array [M, K]")
        m = x.shape[0]
        r1 = m if r1 is None else r1
        if not 0 <= r0 <= r1 <= m:
            raise ValueError(f"row range [{r0}, {r1}) is not within [0, {m}]")
        size = packed_activation_bytes(act, x.shape[1], m)
        x = self._activations(x, x.shape[1])
        if into is None:
            into = np.zeros(size, np.uint8)
        elif into.shape != (size,) or into.dtype != np.uint8 or not into.flags.c_contiguous:
            raise ValueError(f"into must be a contiguous uint8 array of {size} bytes")
        fn(address(x), address(into), x.shape[1] // ACTIVATION_BLOCK[act], r0, r1, m)
        return into

    def close(self) -> None:
        if self._own_pool and self._pool is not None:
            self._pool.close()
        self._pool = None

    def __enter__(self) -> MatmulKernels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

