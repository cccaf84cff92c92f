"""Time the attention kernel at SmolLM2's shapes (9 heads, 3 KV heads, head dim 64).

    python scripts/bench_attention.py [--threads 1 2] [--repeat 2000] [--step] [--depth D]

Decode (one query) at cache lengths 128 and 1024, and one 512-token prefill for scale.
Reports microseconds per call (best of 5 runs) next to the float64 numpy twin.

--depth D: also a 512-token chunk after D cached tokens (a long prompt's last chunks, the
blocked tiles), with its multiply-add rate: 2 * (q . k and p . v products) per second, against
which the machine's f32 FMA peak (2 x 16-lane FMAs per cycle per core) can be set.

--step: also a batched decode step of the real model (8 slots, ~100-160 cached tokens each),
where attention reads cache rows the matmuls have pushed out of the CPU caches. Reports CPU time
per step (thread time with one thread, process time with more), robust to other load on the
machine, unlike wall time.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels.attention import AttentionKernel  # noqa: E402
from engine.kernels.attention_reference import attention_reference  # noqa: E402

N_HEAD, N_KV_HEAD, HEAD_DIM = 9, 3, 64


def best_us(fn, repeat: int) -> float:
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        runs.append((time.perf_counter() - t0) / repeat)
    return min(runs) * 1e6


def bench_step(n_threads: int, n_steps: int = 60) -> str:
    """Median and best CPU ms of a forward pass over 8 one-token chunks (SmolLM2, 8 slots)."""
    import engine  # noqa: PLC0415 - only --step loads the model
    from engine.default_model import default_model_path  # noqa: PLC0415
    from engine.model import Chunk  # noqa: PLC0415

    n_slots, prompt = 8, 100
    rng = np.random.default_rng(0)
    clock = time.thread_time if n_threads == 1 else time.process_time
    with engine.load(default_model_path(), n_ctx=512, n_threads=n_threads, n_slots=n_slots) as model:
        tr = model.transformer
        for slot in range(n_slots):
            tr.forward([Chunk(slot, [int(t) for t in rng.integers(3, 40000, prompt)], 0)], "last")
        times = []
        for i in range(n_steps):
            pos = prompt + i % 60  # caches of 100..159 rows (a chunk truncates its slot to pos)
            chunks = [Chunk(slot, [int(rng.integers(3, 40000))], pos) for slot in range(n_slots)]
            t0 = clock()
            tr.forward(chunks, "last")
            times.append(clock() - t0)
    ms = np.array(times) * 1e3
    return f"{np.median(ms):6.2f} ms (best {ms.min():.2f}) {clock.__name__}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--step", action="store_true", help="also time SmolLM2 8-slot decode steps")
    ap.add_argument("--depth", type=int, default=0, help="also a 512-token chunk after D cached tokens")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    n_ctx = max(2048, args.depth + 512)
    k = rng.standard_normal((n_ctx, N_KV_HEAD, HEAD_DIM)).astype(np.float16)
    v = rng.standard_normal((n_ctx, N_KV_HEAD, HEAD_DIM)).astype(np.float16)
    cases = [("decode", 1, 127), ("decode", 1, 1023), ("prefill", 512, 0)]
    cases += [("prefill", 512, args.depth)] if args.depth else []
    kernels = {n: AttentionKernel(n) for n in args.threads}
    print(f"shapes: n_head={N_HEAD} n_kv_head={N_KV_HEAD} head_dim={HEAD_DIM}")
    for name, n_q, pos0 in cases:
        q = rng.standard_normal((n_q, N_HEAD, HEAD_DIM)).astype(np.float32)
        out = np.empty_like(q)
        repeat = args.repeat if n_q == 1 else max(1, args.repeat // 200)
        line = f"{name:7s} n_q={n_q:3d} cache={pos0 + n_q:4d}:"
        products = N_HEAD * HEAD_DIM * 2 * (n_q * pos0 + n_q * (n_q + 1) // 2)  # q.k and p.v
        for n, kern in kernels.items():
            us = best_us(lambda kern=kern, q=q, pos0=pos0, out=out: kern(q, k, v, pos0, out), repeat)
            line += f"  {n} thr {us:9.1f} us"
            if pos0 >= 512:
                line += f" ({2 * products / us / 1e3:.0f} GFLOP/s)"
        if pos0 < 512:  # (the twin takes seconds at depth)
            ref_us = best_us(lambda q=q, pos0=pos0: attention_reference(q, k, v, pos0), max(1, repeat // 20))
            line += f"  | numpy twin {ref_us:9.1f} us"
        print(line)
    for kern in kernels.values():
        kern.close()
    if args.step:
        for n in args.threads:
            print(f"SmolLM2 decode step, 8 slots x 1 token, caches 100-159, {n} thr: {bench_step(n)}")


if __name__ == "__main__":
    main()
