"""Time the attention kernel at SmolLM2's shapes (9 heads, 3 KV heads, head dim 64).

    python scripts/bench_attention.py [--threads 1 2] [--repeat 2000]

Decode (one query) at cache lengths 128 and 1024, and one 512-token prefill for scale.
Reports microseconds per call (best of 5 runs) next to the float64 numpy twin.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels.attention import AttentionKernel, attention_reference  # noqa: E402

N_HEAD, N_KV_HEAD, HEAD_DIM, N_CTX = 9, 3, 64, 2048


def best_us(fn, repeat: int) -> float:
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        runs.append((time.perf_counter() - t0) / repeat)
    return min(runs) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    k = rng.standard_normal((N_CTX, N_KV_HEAD, HEAD_DIM)).astype(np.float16)
    v = rng.standard_normal((N_CTX, N_KV_HEAD, HEAD_DIM)).astype(np.float16)
    cases = [("decode", 1, 127), ("decode", 1, 1023), ("prefill", 512, 0)]
    kernels = {n: AttentionKernel(n) for n in args.threads}
    print(f"shapes: n_head={N_HEAD} n_kv_head={N_KV_HEAD} head_dim={HEAD_DIM}")
    for name, n_q, pos0 in cases:
        q = rng.standard_normal((n_q, N_HEAD, HEAD_DIM)).astype(np.float32)
        out = np.empty_like(q)
        repeat = args.repeat if n_q == 1 else max(1, args.repeat // 200)
        line = f"{name:7s} n_q={n_q:3d} cache={pos0 + n_q:4d}:"
        for n, kern in kernels.items():
            line += f"  {n} thr {best_us(lambda: kern(q, k, v, pos0, out), repeat):9.1f} us"
        ref_us = best_us(lambda: attention_reference(q, k, v, pos0), max(1, repeat // 20))
        line += f"  | numpy twin {ref_us:9.1f} us"
        print(line)
    for kern in kernels.values():
        kern.close()


if __name__ == "__main__":
    main()
