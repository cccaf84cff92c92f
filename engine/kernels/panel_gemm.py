"""A register-blocked float GEMM over packed weight panels: many activation rows at once (a ViT's
4096 patches, an attention block's queries), where the row kernels of engine.kernels.matmul
re-read the activations for every weight row.

    out[m, r] = dot(W[r, :], x[m, :])    W [N, K] F16 or F32    x float32 [M, K]    out [M, N]

Weights are packed once (pack_panels): panels of P = 32 or 64 weight rows (TILES), each stored
k-major, panel[p, k, j] = W[P p + j, k] (rows past N are zeros), in the weight's own type. The
kernel (P = 32 shown; P = 64 takes 6 rows and 4 weight vectors)

    for kb in K by KC:                        a block's KC slice of x stays in L2
        for mb in M by MC:
            for p in [p0, p1):                the thread's panels
                for each tile of TILE_M rows in mb:
                    acc[12][2] = kb ? out : 0                 24 <16 x float> accumulators
                    for k in kb: w = panel[p, k] (2 vectors); acc[i] += w * x[m0 + i, k]
                    out = acc                                  (masked past N)

one broadcast of x[m, k] per row and 2 weight loads per k feed 24 FMAs; x stays row-major (no
packing per call). A tile past M reads row M - 1 again and stores nothing for it. Summation
over k is in order within a KC slice, slices added in order: not the row kernels' bits, so
callers that must match other paths bit for bit keep those (the vision encoder does not).

gemm_panels_<f16|f32>_<P>(w, x, out, K, r0, r1, M, N) has the row kernels' signature, so
engine.kernels.tasks' task_matmul splits it across a pool by weight rows (a thread takes the
panels starting in its range). Numpy twin: `reference`.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from engine.formats.ggml_types import GGMLQuantizationType as T
from engine.kernels import jit, tasks
from engine.kernels.ir.builder import address
from engine.kernels.ir.consts import V16F
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.pool import Pool

# panel width (weight rows, 16 per vector) -> activation rows per tile: 24 accumulators either
# way; the wider panel needs fewer broadcasts per FMA (measured 122 -> 150 GFLOPS on attention's
# QK^T), the narrower one wastes less on a ragged N (attention's P V, N = 72)
TILES = {32: 12, 64: 6}
PANEL, TILE_M = 32, 12  # the default panel and its tile
# k per slice and rows per block: a block's x slice (768 KB) stays in L2 across the panels, a
# panel's slice (128 KB f16) across the block's tiles; measured on SigLIP's FFN and QKV shapes
# (one thread, F16, 64-wide): KC 128 / 256 / 1024 / 2048 -> ~95 / 110 / 125 / 126 GFLOPS
KC = 1024
MC = 192
CHUNKS_PER_THREAD = 4  # an executor's chunks: balance against each chunk re-reading x
_ELEM = {T.F16: ("half", 2), T.F32: ("float", 4)}
_MASKED = ("declare void @llvm.masked.store.v16f32.p0(<16 x float>, ptr, i32 immarg, <16 x i1>)\n"
           "declare <16 x float> @llvm.masked.load.v16f32.p0(ptr, i32 immarg, <16 x i1>, <16 x float>)\n"
           "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)\n")


def _build(qtype: T, panel: int, tile_m: int) -> str:
    assert MC % tile_m == 0, "a row block is whole tiles (a tile past it would add twice)"
    nv = panel // 16  # weight vectors per k
    elem, esize = _ELEM[qtype]
    name = f"{qtype.name.lower()}_{panel}"
    f = KernelFn(f"void @gemm_panels_{name}(ptr noalias %w, ptr noalias %x, ptr noalias %out, "
                 f"i64 %K, i64 %r0, i64 %r1, i64 %M, i64 %N) #0")
    p0 = f.let(f"udiv i64 {f.add('%r0', panel - 1)}, {panel}")
    p1 = f.let(f"udiv i64 {f.add('%r1', panel - 1)}, {panel}")
    panel_bytes = f.mul("%K", panel * esize)
    x_row = f.mul("%K", 4)
    out_row = f.mul("%N", 4)
    last_row = f.let("sub i64 %M, 1")
    lanes = "<16 x i64> <" + ", ".join(f"i64 {j}" for j in range(16)) + ">"
    n_kb = f.let(f"udiv i64 {f.add('%K', KC - 1)}, {KC}")
    n_mb = f.let(f"udiv i64 {f.add('%M', MC - 1)}, {MC}")

    def k_slice(kb: str) -> None:
        k0 = f.mul(kb, KC)
        kn = f.let(f"sub i64 %K, {k0}")
        kn = f.let(f"select i1 {f.let(f'icmp ult i64 {kn}, {KC}')}, i64 {kn}, i64 {KC}")
        first = f.let(f"icmp eq i64 {kb}, 0")

        def m_block(mb: str) -> None:
            m_lo = f.mul(mb, MC)
            m_hi = f.let(f"select i1 {f.let(f'icmp ult i64 {f.add(m_lo, MC)}, %M')}, "
                         f"i64 {f.add(m_lo, MC)}, i64 %M")
            n_tiles = f.let(f"udiv i64 {f.add(f.let(f'sub i64 {m_hi}, {m_lo}'), tile_m - 1)}, {tile_m}")

            def one_panel(p: str) -> None:
                wp = f.gep("%w", f.add(f.mul(p, panel_bytes), f.mul(k0, panel * esize)))
                n0 = f.mul(p, panel)
                # columns of this panel that exist: masks of the two vectors
                left = f.let(f"sub i64 %N, {n0}")
                masks = []
                for v in range(nv):
                    lim = f.let(f"insertelement <16 x i64> poison, i64 {f.let(f'sub i64 {left}, {16 * v}')}, i64 0")
                    lim = f.let(f"shufflevector <16 x i64> {lim}, <16 x i64> poison, <16 x i32> zeroinitializer")
                    masks.append(f.let(f"icmp slt {lanes}, {lim}"))

                def tile(t: str) -> None:
                    m0 = f.add(m_lo, f.mul(t, tile_m))
                    rows = []
                    for i in range(tile_m):
                        m = f.add(m0, i)
                        m = f.let(f"select i1 {f.let(f'icmp ult i64 {m}, %M')}, i64 {m}, i64 {last_row}")
                        rows.append(m)
                    xs = [f.gep("%x", f.add(f.mul(m, x_row), f.mul(k0, 4))) for m in rows]
                    outs = [f.gep("%out", f.add(f.mul(m, out_row), f.mul(n0, 4))) for m in rows]

                    init = []  # out's partial sums, or zeros on the first slice (out unread)
                    for o in outs:
                        for v in range(nv):
                            prev = f.let(f"call {V16F} @llvm.masked.load.v16f32.p0(ptr {f.gep(o, 64 * v)}, "
                                         f"i32 4, <16 x i1> {masks[v]}, {V16F} zeroinitializer)")
                            init.append(f.select(first, V16F, "zeroinitializer", prev))

                    def step(k: str, acc: list[str]) -> list[str]:
                        off = f.mul(k, panel * esize)
                        ws = []
                        for v in range(nv):
                            raw = f.load(f"<16 x {elem}>", wp, f.add(off, 16 * esize * v), esize)
                            ws.append(raw if elem == "float" else f.let(f"fpext <16 x half> {raw} to {V16F}"))
                        new = []
                        for i in range(tile_m):
                            xb = f.splat_float(f.load("float", xs[i], f.mul(k, 4), 4), 16)
                            for v in range(nv):
                                new.append(f.let(f"call {V16F} @llvm.fma.v16f32({V16F} {ws[v]}, "
                                                 f"{V16F} {xb}, {V16F} {acc[nv * i + v]})"))
                        return new

                    acc = f.loop(kn, list(zip([V16F] * (nv * tile_m), init)), step)
                    for i in range(tile_m):
                        def put(i: int = i) -> None:
                            for v in range(nv):
                                f.do(f"call void @llvm.masked.store.v16f32.p0({V16F} {acc[nv * i + v]}, "
                                     f"ptr {f.gep(outs[i], 64 * v)}, i32 4, <16 x i1> {masks[v]})")
                        f.if_then(f.let(f"icmp ult i64 {f.add(m0, i)}, %M"), put)

                f.each(n_tiles, tile)

            f.loop_range(p0, p1, one_panel)

        f.each(n_mb, m_block)

    f.each(n_kb, k_slice)
    f.do("ret void")
    return f.text()


def build_ir() -> str:
    # AVX-512 hosts prefer 256-bit vectors unless a function asks for 512 (min-legal-vector-width)
    return (_MASKED + "".join(_build(q, p, t) for q in _ELEM for p, t in TILES.items())
            + 'attributes #0 = { "min-legal-vector-width"="512" }\n')


def pack_panels(w: np.ndarray, panel: int = PANEL) -> np.ndarray:
    """W [N, K] (float16 or float32) -> [ceil(N / panel), K, panel] of the same type, zero rows
    past N."""
    n, k = w.shape
    n_p = -(-n // panel)
    padded = np.zeros((n_p * panel, k), w.dtype)
    padded[:n] = w
    return np.ascontiguousarray(padded.reshape(n_p, panel, k).transpose(0, 2, 1))


def reference(panels: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    """The numpy twin: out [M, n] = x @ W^T from the packed panels, in float64."""
    w = panels.astype(np.float64).transpose(0, 2, 1).reshape(-1, panels.shape[1])[:n]
    return np.asarray(x, np.float64) @ w.T


@dataclass(frozen=True)
class PanelMatrix:
    """A weight matrix packed for the panel GEMM; `data` [ceil(N / panel), K, panel] F16 or F32."""
    data: np.ndarray
    n_rows: int
    n_cols: int

    @property
    def qtype(self) -> T:
        return T.F16 if self.data.dtype == np.float16 else T.F32

    @property
    def panel(self) -> int:
        return int(self.data.shape[2])

    @property
    def address(self) -> int:
        return address(self.data)

    @classmethod
    def pack(cls, w: np.ndarray, panel: int = PANEL) -> PanelMatrix:
        if w.dtype not in (np.float16, np.float32) or w.ndim != 2:
            raise ValueError(f"panels take a 2-D float16 or float32 matrix, got {w.dtype} {w.shape}")
        if panel not in TILES:
            raise ValueError(f"panel must be one of {sorted(TILES)}, got {panel}")
        return cls(pack_panels(w, panel), w.shape[0], w.shape[1])


_SIG = (None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p) + (ctypes.c_int64,) * 5


class PanelGemm:
    """The compiled kernels. `matmul` splits by panels: across `pool` in equal shares (its
    native workers, task_matmul), or, given `executor` (threads), into CHUNKS_PER_THREAD chunks
    per thread that free threads take in turn, so a thread the OS holds back (a busy machine)
    delays its own chunk, not half the work. One thread without either."""

    def __init__(self, pool: Pool | None = None, executor: Executor | None = None,
                 n_threads: int = 1) -> None:
        lib = jit.compile_cached("panel_gemm", (tuple(TILES.items()), KC, MC), build_ir)
        names = {(q, p): f"gemm_panels_{q.name.lower()}_{p}" for q in _ELEM for p in TILES}
        self._fn = {key: lib.function(name, *_SIG) for key, name in names.items()}
        self._addr = {key: lib.address(name) for key, name in names.items()}
        self._pool = pool
        self._executor, self._n_threads = executor, n_threads
        self._split = tasks.load_tasks(jit.host_has("f16c")).address["task_matmul"] if pool else 0
        self._step = np.zeros(len(tasks.STEP.fields), np.int64)
        self._lock = threading.Lock()

    def matmul(self, w: PanelMatrix, x: np.ndarray, out: np.ndarray | None = None,
               threads: bool = True) -> np.ndarray:
        """out [M, N] = x [M, K] @ W^T; `threads=False` runs on the calling thread alone (for
        callers that parallelise above, e.g. attention heads)."""
        if x.ndim != 2 or x.shape[1] != w.n_cols or x.dtype != np.float32 or not x.flags.c_contiguous:
            raise ValueError(f"x must be C-contiguous float32 [M, {w.n_cols}], got {x.dtype} {x.shape}")
        m = x.shape[0]
        if out is None:
            out = np.empty((m, w.n_rows), np.float32)
        elif out.shape != (m, w.n_rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 {(m, w.n_rows)}")
        if m == 0:
            return out
        fn, args = self._fn[w.qtype, w.panel], (w.address, address(x), address(out), w.n_cols)
        if threads and self._executor is not None and self._n_threads > 1:
            n_panels = -(-w.n_rows // w.panel)
            n_chunks = min(n_panels, CHUNKS_PER_THREAD * self._n_threads)
            edges = [w.panel * (n_panels * c // n_chunks) for c in range(n_chunks + 1)]
            ranges = [(lo, min(hi, w.n_rows)) for lo, hi in itertools.pairwise(edges) if lo < hi]
            list(self._executor.map(lambda r: fn(*args, r[0], r[1], m, w.n_rows), ranges))
            return out
        if not threads or self._pool is None or self._pool.n_threads == 1:
            fn(*args, 0, w.n_rows, m, w.n_rows)
            return out
        with self._lock:
            tasks.STEP.fill(self._step, n_tokens=m)
            packed = tasks.MATMUL.pack(fn=self._addr[w.qtype, w.panel], w=w.address, x=address(x),
                                       out=address(out), nb=w.n_cols, n_rows=w.n_rows,
                                       m_at=tasks.M_TOKENS)
            self._pool.run_task(self._split, packed, address(self._step))
        return out
