"""Decode with a q8_0 KV cache against f16 at long cached contexts (issue #30), SmolLM2.

    flock /tmp/modelyard-bench.lock python scripts/bench_kvq.py [--depths 4096 7168] [--steps 16]
        [--peer-bin /work/llama/build/bin]

Per depth, each cache type's model gets its slot filled to `depth` positions (the rows written
directly: a decode step's cost does not depend on the cached values, and a 7k-token prefill per
type would dominate the run), then decodes `steps` tokens; the types are interleaved round by
round and the median step time reported. With --peer-bin, llama-bench's tg at the same depths
(-fa 1, -ctk/-ctv f16 and q8_0) runs in the same invocation for the table.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.default_model import default_model_path  # noqa: E402
from engine.kv_types import quantize_rows  # noqa: E402
from engine.model import Chunk  # noqa: E402

TYPES = ("f16", "q8_0")


def fill(model: engine.Model, depth: int, rng: np.random.Generator) -> None:
    """Slot 0 holds `depth` positions of plausible keys and values (unit normals, stored in the
    cache's type)."""
    cache = model.transformer.cache
    for g, grp in enumerate(cache.layout.groups):
        shape = (len(grp.layers), depth, grp.n_head_kv, grp.head_dim)
        for arrays, t in ((cache.k, cache.type_k), (cache.v, cache.type_v)):
            arrays[g][0, :, :depth] = quantize_rows(rng.standard_normal(shape, np.float32), t)
    cache.stored(0, list(range(depth)), 0)


def step_ms(model: engine.Model, depth: int, steps: int) -> list[float]:
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        model.transformer.forward([Chunk(0, [100 + i], depth + i)], "last")
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[4096, 7168])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peer-bin", type=Path, default=None)
    a = ap.parse_args()
    path = default_model_path()
    n_ctx = max(a.depths) + a.steps + 1
    rng = np.random.default_rng(0)
    models = {t: engine.load(path, n_ctx=n_ctx, n_threads=a.threads, type_k=t, type_v=t)
              for t in TYPES}
    try:
        print(f"SmolLM2 decode, {a.threads} threads, median ms per token over {a.rounds} rounds "
              f"of {a.steps} steps (shared machine)")
        for depth in a.depths:
            times: dict[str, list[float]] = {t: [] for t in TYPES}
            for _ in range(a.rounds):
                for t, model in models.items():
                    fill(model, depth, rng)
                    times[t] += step_ms(model, depth, a.steps)
            line = "  ".join(f"{t} {statistics.median(v):.2f} ms ({1e3 / statistics.median(v):.1f} tok/s)"
                             for t, v in times.items())
            kv = {t: m.transformer.cache.nbytes >> 20 for t, m in models.items()}
            print(f"depth {depth}: {line}   KV MiB {kv}")
    finally:
        for model in models.values():
            model.close()
    if a.peer_bin is not None:
        for t in TYPES:
            cmd = [str(a.peer_bin / "llama-bench"), "-m", str(path), "-t", str(a.threads),
                   "-fa", "1", "-ctk", t, "-ctv", t, "-d", ",".join(map(str, a.depths)),
                   "-p", "0", "-n", str(a.steps), "-r", "1", "-o", "md"]
            print(subprocess.run(cmd, capture_output=True, text=True, check=False).stdout)


if __name__ == "__main__":
    main()
