"""Matmul throughput in GB/s of weight bytes per tensor type, for SmolLM2-135M's shapes.

    python scripts/bench_matmul.py [--types Q4_1,Q8_0] [--threads 1,2] [--m 1] [--portable]
                                   [--no-vnni]

Every type the engine supports is measured by default (engine.quants.TYPES); a shape whose
row length is not a whole number of the type's blocks (576 for the 256-value super-blocks of
the K-quants and IQ4_XS) shows '-'.

Each figure is the best of several timed runs of many back-to-back calls (the weights of one
matrix stay partly in cache between calls, as they would not in a real decode step, so the
'stream' row, which cycles through enough matrices to defeat the cache, is the honest one).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from engine.kernels.matmul import MatmulKernels
from engine.quants import TYPES, QuantMatrix, T, block_size, random_quant_matrix

# (n_rows, n_cols): attention q/o (and k/v), FFN gate/up, FFN down, output (Q8_0 in the model)
SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(t.name for t in sorted(TYPES, key=lambda t: t.value)))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--m", type=int, default=1, help="activation rows per call")
    ap.add_argument("--portable", action="store_true", help="generic IR instead of AVX2")
    ap.add_argument("--no-vnni", action="store_true", help="plain AVX2 even where VNNI exists")
    args = ap.parse_args()
    types = [T[name] for name in args.types.split(",")]
    rng = np.random.default_rng(0)
    print(f"M={args.m}; GB/s of weight bytes (us per call)")
    for n_threads in (int(s) for s in args.threads.split(",")):
        mk = MatmulKernels(types, n_threads=n_threads, portable=args.portable,
                           vnni=False if args.no_vnni else None)
        isa = "portable" if mk.portable else "avx2" + " vnni" * mk.vnni + " avx512-pairs" * mk.wide
        print(f"threads={n_threads} ({isa}, tiles {mk.tiles})")
        header = "  type  " + "".join(f"{f'{r}x{c}':>18}" for r, c in SHAPES) + f"{'stream':>18}"
        print(header)
        for t in types:
            cells = []
            for rows, cols in SHAPES:
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
