"""One weight matrix at M = 1 from three kinds of memory: the file's mapping, anonymous 4 KiB
pages, and anonymous memory on 2 MiB huge pages (engine.hugepages), interleaved, medians.

    python scripts/bench_hugepages.py [MODEL.gguf] [--tensor output] [--threads 2] [--rounds 15]

The default tensor is the output matrix (token_embd when tied): the largest one a decode step
reads, and big enough (hundreds of MB) that it streams from DRAM. Each kind holds the same bytes
and runs the file-layout kernel; where the interleaved kernels take the type, its repacked copy
runs too, on 4 KiB pages and on huge pages (as engine.model holds it).
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from engine import hugepages
from engine.formats.quants import QuantMatrix, quant_type
from engine.formats.repack import RepackedMatrix
from engine.gguf import GGUFFile
from engine.kernels.gemm.facade import GemmKernels, host_isa
from engine.kernels.matmul import MatmulKernels

DEFAULT = os.path.expanduser("~/.cache/modelyard/gemma-3-270m-q4_k_m.gguf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model", nargs="?", default=DEFAULT)
    ap.add_argument("--tensor", default="output", help="tensor name without .weight")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if not hugepages.available():
        raise SystemExit("this host gives no transparent huge pages (or MODELYARD_HUGEPAGES=off)")

    f = GGUFFile(args.model)
    name = f"{args.tensor}.weight" if f"{args.tensor}.weight" in f.tensors else "token_embd.weight"
    info = f.tensors[name]
    n_cols, n_rows = int(info.shape[0]), int(info.shape[1])
    qtype = info.qtype
    raw = f.tensor_data(name).reshape(n_rows, -1)
    small_pages = functools.partial(hugepages.anonymous, huge=False)

    def copy_into(alloc: Callable[[int], np.ndarray]) -> np.ndarray:
        out = alloc(raw.nbytes).reshape(raw.shape)
        out[:] = raw
        return out

    small, huge = copy_into(small_pages), copy_into(hugepages.anonymous)
    kinds = {"file mapping": raw, "anonymous 4 KiB": small, "huge pages": huge}
    mats: dict[str, QuantMatrix | RepackedMatrix] = {
        k: QuantMatrix(v, qtype, n_rows, n_cols) for k, v in kinds.items()}
    x = np.random.default_rng(0).standard_normal((1, n_cols)).astype(np.float32)
    with MatmulKernels([qtype], n_threads=args.threads) as mk:
        first = mk.matmul(mats["file mapping"], x)
        assert all(np.array_equal(mk.matmul(w, x), first) for w in mats.values())
        source = QuantMatrix(raw, qtype, n_rows, n_cols)
        if mk.repacks(source):
            gk = GemmKernels([qtype], host_isa())
            mats["repacked, 4 KiB"] = gk.repack(source, small_pages)
            mats["repacked, huge"] = gk.repack(source, hugepages.anonymous)
        times: dict[str, list[float]] = {k: [] for k in mats}
        for _ in range(args.rounds):
            for k, w in mats.items():
                t = time.perf_counter()
                mk.matmul(w, x)
                times[k].append(time.perf_counter() - t)
    print(f"{name} {quant_type(qtype).name} {n_rows}x{n_cols}, {raw.nbytes / 1e6:.1f} MB, "
          f"{args.threads} threads, median of {args.rounds}")
    base = statistics.median(times["file mapping"])
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"  {k:16s} {med * 1e3:7.3f} ms  {mats[k].nbytes / med / 1e9:5.1f} GB/s  {base / med:4.2f}x")


if __name__ == "__main__":
    main()
