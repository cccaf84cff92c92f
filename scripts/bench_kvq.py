"""Long contexts on SmolLM2 (issues #30, #36): decode with a q8_0 KV cache against f16 at long
cached contexts, and the prefill of a long prompt against llama-bench's.

    flock /tmp/modelyard-bench.lock python scripts/bench_kvq.py [--depths 4096 7168] [--steps 16]
        [--types f16 q8_0 q4_0] [--bandwidth 35] [--peer-bin /work/llama/build/bin]
    flock /tmp/modelyard-bench.lock python scripts/bench_kvq.py --depths --prefill 6000 \
        --peer-bin /work/llama/build/bin [--model FILE] [--rounds 3]

Per depth, each cache type's model gets its slot filled to `depth` positions (the rows written
directly: a decode step's cost does not depend on the cached values, and a 7k-token prefill per
type would dominate the run), then decodes `steps` tokens; the types are interleaved round by
round and the median step time reported, with the GB/s a step reads (the weight matrices once,
the output matrix included, plus every cached layer's K and V rows up to the depth) and its
fraction of --bandwidth (what the cores can stream). With --peer-bin, llama-bench's tg at the same depths
(-fa 1, -ctk/-ctv f16 and q8_0) runs in the same invocation for the table.

--prefill N: an N-token prompt (random token ids) prefilled in the engine's 512-token chunks
into an empty f16 cache, alternating round by round with `llama-bench -p N -n 0 -r 1` from
--peer-bin (any llama-bench: llama.cpp's, ik_llama.cpp's); prints the medians and one line
`prefill N: ours X tok/s, peer Y tok/s, ratio R` for scripts to read. `--depths` with no value
skips the decode table.
"""
from __future__ import annotations

import argparse
import json
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


def fill(model: engine.Model, depth: int, rng: np.random.Generator) -> None:
    """Slot 0 holds `depth` positions of plausible keys and values (unit normals, stored in the
    cache's type)."""
    cache = model.transformer.cache
    for g, grp in enumerate(cache.layout.groups):
        shape = (len(grp.layers), depth, grp.n_head_kv, grp.head_dim)
        for arrays, t in ((cache.k, cache.type_k), (cache.v, cache.type_v)):
            arrays[g][0, :, :depth] = quantize_rows(rng.standard_normal(shape, np.float32), t)
    cache.stored(0, list(range(depth)), 0)


def step_bytes(model: engine.Model, depth: int) -> int:
    """Bytes one decode step at `depth` reads: every weight matrix once, and each cached
    layer's key and value rows of the depth positions."""
    tr = model.transformer
    cache = tr.cache
    kv = sum(len(g.layers) * min(depth, g.ring) * g.n_head_kv
             * (cache.type_k.row_bytes(g.head_dim) + cache.type_v.row_bytes(g.head_dim))
             for g in cache.layout.groups)
    return sum(m.nbytes for m in tr.weights.matrices()) + kv


def step_ms(model: engine.Model, depth: int, steps: int) -> list[float]:
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        model.transformer.forward([Chunk(0, [100 + i], depth + i)], "last")
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def prefill_tok_s(model: engine.Model, n: int, rng: np.random.Generator) -> float:
    ids = [int(i) for i in rng.integers(100, model.transformer.hp.n_vocab - 100, n)]
    model.transformer.cache.truncate(0, 0)
    t0 = time.perf_counter()
    model._prefill(ids, 0, "last")
    return n / (time.perf_counter() - t0)


def peer_prefill_tok_s(peer_bin: Path, path: Path, n: int, threads: int) -> float:
    cmd = [str(peer_bin / "llama-bench"), "-m", str(path), "-t", str(threads), "-p", str(n),
           "-n", "0", "-r", "1", "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout)[0]["avg_ts"])


def bench_prefill(path: Path, n: int, threads: int, rounds: int, peer_bin: Path | None) -> None:
    rng = np.random.default_rng(0)
    model = engine.load(path, n_ctx=n + 16, n_threads=threads)
    ours: list[float] = []
    peer: list[float] = []
    try:
        prefill_tok_s(model, 64, rng)  # warm: the first call pages the weights in
        for _ in range(rounds):
            ours.append(prefill_tok_s(model, n, rng))
            if peer_bin is not None:
                peer.append(peer_prefill_tok_s(peer_bin, path, n, threads))
            print(f"  round: ours {ours[-1]:.1f}" + (f"  peer {peer[-1]:.1f}" if peer else "") + " tok/s",
                  flush=True)
    finally:
        model.close()
    o = statistics.median(ours)
    if peer:
        p = statistics.median(peer)
        print(f"prefill {n}: ours {o:.1f} tok/s, peer {p:.1f} tok/s, ratio {o / p:.2f}")
    else:
        print(f"prefill {n}: ours {o:.1f} tok/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", type=int, nargs="*", default=[4096, 7168])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", nargs="+", default=["f16", "q8_0"], help="KV types to compare")
    ap.add_argument("--bandwidth", type=float, default=35.0, help="GB/s the cores can stream")
    ap.add_argument("--peer-bin", type=Path, default=None)
    ap.add_argument("--prefill", type=int, default=0, help="also an N-token prefill (0: none)")
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2 Q4_1)")
    a = ap.parse_args()
    path = a.model or default_model_path()
    if a.prefill:
        print(f"prefill of {a.prefill} tokens, {a.threads} threads, {a.rounds} rounds interleaved "
              f"(shared machine)")
        bench_prefill(path, a.prefill, a.threads, a.rounds, a.peer_bin)
    if not a.depths:
        return
    n_ctx = max(a.depths) + a.steps + 1
    rng = np.random.default_rng(0)
    models = {t: engine.load(path, n_ctx=n_ctx, n_threads=a.threads, type_k=t, type_v=t)
              for t in a.types}
    try:
        print(f"SmolLM2 decode, {a.threads} threads, median ms per token over {a.rounds} rounds "
              f"of {a.steps} steps (shared machine)")
        for depth in a.depths:
            times: dict[str, list[float]] = {t: [] for t in a.types}
            for _ in range(a.rounds):
                for t, model in models.items():
                    fill(model, depth, rng)
                    times[t] += step_ms(model, depth, a.steps)
            print(f"depth {depth}:")
            for t, v in times.items():
                ms = statistics.median(v)
                gb_s = step_bytes(models[t], depth) / ms / 1e6
                print(f"  {t:5s} {ms:6.2f} ms {1e3 / ms:6.1f} tok/s  reads {gb_s:5.1f} GB/s = "
                      f"{gb_s / a.bandwidth:.0%} of {a.bandwidth:g}  "
                      f"(KV {models[t].transformer.cache.nbytes >> 20} MiB)")
    finally:
        for model in models.values():
            model.close()
    if a.peer_bin is not None:
        for t in a.types:
            cmd = [str(a.peer_bin / "llama-bench"), "-m", str(path), "-t", str(a.threads),
                   "-fa", "1", "-ctk", t, "-ctv", t, "-d", ",".join(map(str, a.depths)),
                   "-p", "0", "-n", str(a.steps), "-r", "1", "-o", "md"]
            print(subprocess.run(cmd, capture_output=True, text=True, check=False).stdout)


if __name__ == "__main__":
    main()
