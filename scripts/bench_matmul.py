"""Matmul throughput in GB/s of weight bytes per tensor type, for SmolLM2-135M's shapes.

    python scripts/bench_matmul.py [--types Q4_1,Q8_0] [--threads 1,2] [--m 1] [--portable]
                                   [--no-vnni] [--shapes 135m|1b]
    python scripts/bench_matmul.py --ab-wide --types Q4_1,Q8_0 --shapes 1b --ms 1,8,64,512
    python scripts/bench_matmul.py --ab-layout --types Q4_K,Q6_K --shapes 1b --ms 1,8,512
    python scripts/bench_matmul.py --ab-tiles 1,2 --types Q4_K,Q5_K --shapes 1b --ms 8,512
    python scripts/bench_matmul.py --ab-amx --types Q4_1,Q8_0 --ms 16,64,512

--ab-wide compares MatmulKernels' AVX-512 form (wide: the legacy types' row pairs) with
wide=False in one process, one thread: timed runs (thread CPU time) alternate between them
and the medians are reported (GB/s of weight bytes, GFLOP/s, wide/narrow speed ratio; the two
outputs must be the same bits). Up to M = 8 the set of matrices is larger than the caches, as a
decode step reads them. --ab-layout compares the file-layout kernels with the row-interleaved
ones on repacked copies of the same matrices (engine.kernels.gemm; the K-quants must give the
same bits, the others need not). --ab-tiles A,B compares the row-interleaved kernels built with
register tiles of A and of B activation rows (always the same bits). --ab-amx compares the
legacy types' VNNI nest with their AMX-INT8 tiles (engine.kernels.gemm.amx; the same bits) on
the same repacked matrices; it needs a CPU with AMX-INT8.

Every type the engine supports is measured by default (engine.formats.quants.TYPES); a shape whose
row length is not a whole number of the type's blocks (576 for the 256-value super-blocks of
the K-quants and IQ4_XS) shows '-'.

Each figure is the best of several timed runs of many back-to-back calls (the weights of one
matrix stay partly in cache between calls, as they would not in a real decode step, so the
'stream' row, which cycles through enough matrices to defeat the cache, is the honest one).
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from engine.formats.quants import TYPES, QuantMatrix, T, block_size, random_quant_matrix
from engine.formats.repack import RepackedMatrix
from engine.kernels import gemm
from engine.kernels.gemm.facade import GemmKernels, host_isa
from engine.kernels.matmul import MatmulKernels

# (n_rows, n_cols): attention q/o (and k/v), FFN gate/up, FFN down, output (Q8_0 in the model)
SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
# a 1.1B llama (TinyLlama's n_embd 2048, n_ff 5632): attention q/o, FFN gate/up, FFN down
SHAPES_1B = [(2048, 2048), (5632, 2048), (2048, 5632)]


def bench(mk: MatmulKernels, mats: list[QuantMatrix], m: int,
          min_seconds: float = 0.2) -> tuple[float, float]:
    """(GB/s of weight bytes, microseconds per call), cycling through `mats`."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(m, mats[0].n_cols)).astype(np.float32)
    outs = [np.empty((m, w.n_rows), np.float32) for w in mats]
    for w, o in zip(mats, outs):
        mk.matmul(w, x, o)
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            for w, o in zip(mats, outs):
                mk.matmul(w, x, o)
        dt = time.perf_counter() - t0
        if dt >= min_seconds / 4:
            break
        calls *= 2
    best = dt
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            for w, o in zip(mats, outs):
                mk.matmul(w, x, o)
        best = min(best, time.perf_counter() - t0)
    n = calls * len(mats)
    nbytes = sum(w.nbytes for w in mats) * calls
    return nbytes / best / 1e9, best / n * 1e6


def _copies(one: QuantMatrix, total_bytes: int) -> list[QuantMatrix]:
    n = max(1, total_bytes // one.nbytes)
    return [one] + [QuantMatrix(one.raw.copy(), one.qtype, one.n_rows, one.n_cols) for _ in range(n - 1)]


Matmul = Callable[[QuantMatrix, np.ndarray, np.ndarray], None]  # (w, x [M, K], out [M, N])


def _wide_forms(t: T) -> dict[str, Matmul]:
    narrow, wide = MatmulKernels([t], wide=False, interleaved=False), MatmulKernels([t], interleaved=False)
    if not wide.wide:
        raise SystemExit("this host has no AVX-512 VNNI/BW/VL: there is no wide form to compare")
    return {"narrow": lambda w, x, o: narrow.matmul(w, x, o), "wide": lambda w, x, o: wide.matmul(w, x, o)}


def _interleaved(t: T, tile: int | None = None, amx_tiles: bool | None = None) -> GemmKernels:
    gk = GemmKernels([t], host_isa(), tile, amx_tiles)
    if not gk.has(t):
        raise SystemExit(f"no interleaved kernel for {t.name} on {gk.isa}")
    return gk


def _on_repacked(gk: GemmKernels, packed: dict[int, RepackedMatrix]) -> Matmul:
    """gk's matmul on each matrix's repacked copy, made on first use and kept in `packed`."""
    def matmul(w: QuantMatrix, x: np.ndarray, o: np.ndarray) -> None:
        p = packed.get(id(w))
        if p is None:
            p = packed[id(w)] = gk.repack(w)
        gk.matmul(p, x, o)
    return matmul


def _layout_forms(t: T) -> dict[str, Matmul]:
    """The file-layout kernel and the row-interleaved one (engine.kernels.gemm) on the same
    matrices: each matrix is repacked once, on first use."""
    file_layout = MatmulKernels([t], interleaved=False)
    return {"file": lambda w, x, o: file_layout.matmul(w, x, o),
            "repacked": _on_repacked(_interleaved(t), {})}


def _tile_forms(tiles: tuple[int, ...]) -> Callable[[T], dict[str, Matmul]]:
    """The row-interleaved kernel with two register tile sizes, on the same repacked matrices."""
    def forms(t: T) -> dict[str, Matmul]:
        packed: dict[int, RepackedMatrix] = {}
        return {f"tile{n}": _on_repacked(_interleaved(t, n), packed) for n in tiles}
    return forms


def _amx_forms(t: T) -> dict[str, Matmul]:
    """The row-interleaved kernel on VNNI and on AMX-INT8 tiles, on the same repacked matrices."""
    packed: dict[int, RepackedMatrix] = {}
    return {"vnni": _on_repacked(_interleaved(t, amx_tiles=False), packed),
            "amx": _on_repacked(_interleaved(t, amx_tiles=True), packed)}


def _cpu_seconds(fn: Matmul, mats: list[QuantMatrix], x: np.ndarray, outs: list[np.ndarray],
                 calls: int) -> float:
    """This thread's CPU time for `calls` rounds over mats (time preempted on a shared machine
    does not count)."""
    t0 = time.thread_time()
    for _ in range(calls):
        for w, o in zip(mats, outs):
            fn(w, x, o)
    return time.thread_time() - t0


def ab_forms(types: list[T], shapes: list[tuple[int, int]], ms: list[int],
             forms_of: Callable[[T], dict[str, Matmul]] = _wide_forms, rounds: int = 11,
             min_seconds: float = 0.05) -> None:
    """Two forms of each type's kernel (wide/narrow, or file layout/repacked), one thread,
    interleaved runs, medians."""
    rng = np.random.default_rng(0)
    print(f"one thread, medians of {rounds} interleaved runs (thread CPU time); "
          "GB/s of weight bytes, GFLOP/s")
    for t in types:
        forms = forms_of(t)
        old, new = forms
        print(f"  {'type':6s}{'shape':>11}{'M':>5}{f'{old} GB/s':>15}{f'{new} GB/s':>15}"
              f"{f'{old} GFLOP/s':>18}{f'{new} GFLOP/s':>18}{f'{new}/{old}':>15}")
        for rows, cols in shapes:
            if cols % block_size(t)[0]:
                continue
            one = random_quant_matrix(t, rows, cols, rng)
            for m in ms:
                mats = _copies(one, (64 << 20) if m <= 8 else 0)
                x = rng.normal(size=(m, cols)).astype(np.float32)  # [M, K]
                outs = {k: [np.empty((m, rows), np.float32) for _ in mats] for k in forms}

                def run(k: str, calls: int) -> float:
                    return _cpu_seconds(forms[k], mats, x, outs[k], calls)  # noqa: B023 (called here)

                for k in forms:
                    run(k, 1)
                same_bits = forms_of is not _layout_forms or t in gemm.FILE_LAYOUT_BITS
                if same_bits and not np.array_equal(outs[old][0], outs[new][0]):
                    raise SystemExit(f"{t.name} {rows}x{cols} M={m}: the two forms differ")
                calls = 1
                while run(old, calls) < min_seconds:
                    calls *= 2
                times: dict[str, list[float]] = {k: [] for k in forms}
                for r in range(rounds):
                    for k in (old, new) if r % 2 == 0 else (new, old):
                        times[k].append(run(k, calls))
                med = {k: float(np.median(v)) / (calls * len(mats)) for k, v in times.items()}
                gbs = {k: one.nbytes / v / 1e9 for k, v in med.items()}
                gflops = {k: 2 * m * rows * cols / v / 1e9 for k, v in med.items()}
                print(f"  {t.name:6s}{f'{rows}x{cols}':>11}{m:>5}{gbs[old]:15.2f}{gbs[new]:15.2f}"
                      f"{gflops[old]:18.1f}{gflops[new]:18.1f}{med[old] / med[new]:14.3f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(t.name for t in sorted(TYPES, key=lambda t: t.value)))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--m", type=int, default=1, help="activation rows per call")
    ap.add_argument("--portable", action="store_true", help="generic IR instead of AVX2")
    ap.add_argument("--no-vnni", action="store_true", help="plain AVX2 even where VNNI exists")
    ap.add_argument("--shapes", choices=("135m", "1b"), default="135m",
                    help="SmolLM2-135M's matrix shapes or a 1.1B llama's")
    ap.add_argument("--ab-wide", action="store_true",
                    help="wide vs narrow kernels, interleaved, one thread (see above)")
    ap.add_argument("--ab-layout", action="store_true",
                    help="file-layout vs repacked (row-interleaved) kernels, the same way")
    ap.add_argument("--ab-tiles", metavar="A,B",
                    help="row-interleaved kernels with register tiles of A vs B rows, the same way")
    ap.add_argument("--ab-amx", action="store_true",
                    help="row-interleaved kernels on VNNI vs AMX-INT8 tiles, the same way")
    ap.add_argument("--ms", default="1,8,64,512", help="activation rows per call, for --ab-*")
    args = ap.parse_args()
    types = [T[name] for name in args.types.split(",")]
    shapes = SHAPES_1B if args.shapes == "1b" else SHAPES
    if args.ab_wide or args.ab_layout or args.ab_tiles or args.ab_amx:
        forms = (_tile_forms(tuple(int(n) for n in args.ab_tiles.split(","))) if args.ab_tiles
                 else _amx_forms if args.ab_amx
                 else _layout_forms if args.ab_layout else _wide_forms)
        ab_forms(types, shapes, [int(s) for s in args.ms.split(",")], forms)
        return
    rng = np.random.default_rng(0)
    print(f"M={args.m}; GB/s of weight bytes (us per call)")
    for n_threads in (int(s) for s in args.threads.split(",")):
        mk = MatmulKernels(types, n_threads=n_threads, portable=args.portable,
                           vnni=False if args.no_vnni else None)
        isa = "portable" if mk.portable else "avx2" + " vnni" * mk.vnni + " avx512-pairs" * mk.wide
        print(f"threads={n_threads} ({isa}, tiles {mk.tiles})")
        header = "  type  " + "".join(f"{f'{r}x{c}':>18}" for r, c in shapes) + f"{'stream':>18}"
        print(header)
        for t in types:
            cells = []
            for rows, cols in shapes:
                if cols % block_size(t)[0]:
                    cells.append(f"{'-':>18}")
                    continue
                w = random_quant_matrix(t, rows, cols, rng)
                gbs, us = bench(mk, [w], args.m)
                cells.append(f"{gbs:10.1f} ({us:5.0f})")
            # a set of matrices larger than the caches, like one decode step's worth
            cols = 576 if 576 % block_size(t)[0] == 0 else 1536
            rows = 1536 if cols == 576 else 576
            one = random_quant_matrix(t, rows, cols, rng)
            copies = max(2, (96 << 20) // one.nbytes)
            mats = [QuantMatrix(one.raw.copy(), t, rows, cols) for _ in range(copies)]
            gbs, us = bench(mk, mats, args.m)
            cells.append(f"{gbs:10.1f} ({us:5.0f})")
            print(f"  {t.name:6s}" + "".join(cells))
        mk.close()


if __name__ == "__main__":
    main()
