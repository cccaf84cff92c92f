"""The mixture-of-experts benchmark: modelyard against llama.cpp on the bench MoE, interleaved.

    python scripts/bench_moe.py [MODEL.gguf] [--rounds 3] [--threads 2] [--batch 8]
                                [--peer-bin /work/llama/build/bin] [--bandwidth 35]

MODEL defaults to ~/.cache/modelyard/bench/bench-moe-2.6b.Q4_K_M.gguf, made by
    python scripts/make_bench_model.py --arch qwen3moe [--peer-bin DIR]
(a random-weight qwen3moe with Qwen3-30B-A3B's ratios: 24 layers of 1024, 64 experts of 512 with
8 used, 2.6B weights, 0.41B read per token; Q4_K_M by llama.cpp's quantizer).

Every round runs a fresh process of each engine, interleaved (ours, llama.cpp, ours, ...), so
that other load hits both alike; the table gives medians over --rounds and ours / llama.cpp:
    decode   tokens/s over 128 greedy tokens after an 8-token prompt, one forward per token
             (llama.cpp: llama-bench's tg128, from an empty context)
    prefill  tokens/s of a 512-token prompt in a fresh context, best of 2 (llama-bench: pp512,
             best of 3)
    batch    tokens/s of --batch sequences decoding together (100 cached tokens each, one
             forward per step for all of them), and its ratio to one sequence's decode
llama.cpp is a peer, never a dependency: its llama-bench from --peer-bin (a build of the
llama.cpp that llama-cpp-python 0.3.36 vendors). Without it, only modelyard's figures print.

`active GB/s` is the weights one decode token reads (every matrix but the embedding table, the
expert stacks at n_expert_used / n_expert of their bytes) times decode tokens/s, against
--bandwidth (GB/s the threads stream; ~35 with two threads on the 2-core test host).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path.home() / ".cache" / "modelyard" / "bench" / "bench-moe-2.6b.Q4_K_M.gguf"
DEFAULT_PEER_BIN = Path("/work/llama/build/bin")
TEXT = ("The quick brown fox jumps over the lazy dog while the curious cat watches from the old "
        "wooden fence, thinking about dinner and the long winter ahead. ") * 40

# One JSON line: prefill, decode, batch (tokens/s), active_bytes (per decode token)
OURS = r'''
import sys, json, time
import numpy as np
import engine
from engine.formats import quants
from engine.model import Chunk
path, threads, batch, text = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
model = engine.load(path, n_ctx=1024, n_threads=threads, n_slots=batch)
tr = model.transformer
ids = model.tokenizer.encode(text)
out = {}
best = 0.0
for _ in range(2):
    tr.cache.tokens[0] = []
    t = time.perf_counter()
    tr.forward([Chunk(0, ids[:512], 0)], "last")
    best = max(best, 512 / (time.perf_counter() - t))
out["prefill"] = best
tr.cache.tokens[0] = []
tok = int(np.argmax(tr.forward([Chunk(0, ids[:8], 0)], "last")[0]))
t = time.perf_counter()
for i in range(128):
    tok = int(np.argmax(tr.forward([Chunk(0, [tok], 8 + i)], "last")[0]))
out["decode"] = 128 / (time.perf_counter() - t)
for s in range(batch):  # B different prompts of 100 tokens
    tr.cache.tokens[s] = []
    tr.forward([Chunk(s, ids[s:s + 100], 0)], "last")
toks = [ids[100 + s] for s in range(batch)]
t = time.perf_counter()
for i in range(64):
    logits = tr.forward([Chunk(s, [toks[s]], 100 + i) for s in range(batch)], "last")
    toks = [int(np.argmax(row)) for row in logits]
out["batch"] = 64 * batch / (time.perf_counter() - t)
hp = tr.hp
share = hp.dim("n_expert_used") / hp.dim("n_expert")
read = tr.weights.output.nbytes
for layer in tr.weights.layers:
    for m in vars(layer).values():
        if isinstance(m, quants.StackedMatrix):
            read += m.raw.nbytes * share
        elif isinstance(m, quants.QuantMatrix):
            read += m.nbytes
out["active_bytes"] = read
model.close()
print(json.dumps(out))
'''


def run_ours(model: Path, threads: int, batch: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", OURS, str(model), str(threads), str(batch), TEXT],
                          capture_output=True, text=True, cwd=REPO, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"modelyard failed:\n{proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run_peer(peer_bin: Path, model: Path, threads: int) -> dict:
    """llama-bench's pp512 (best of 3 repetitions, as ours is a best) and tg128 (median of 3),
    after its warm-up run."""
    proc = subprocess.run([str(peer_bin / "llama-bench"), "-m", str(model), "-t", str(threads),
                           "-p", "512", "-n", "128", "-r", "3", "-o", "json"],
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed:\n{proc.stderr[-2000:]}")
    out = {}
    for test in json.loads(proc.stdout):
        if test["n_prompt"]:
            out["prefill"] = max(test["samples_ts"])
        else:
            out["decode"] = statistics.median(test["samples_ts"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="sequences decoding together")
    ap.add_argument("--peer-bin", type=Path, default=DEFAULT_PEER_BIN,
                    help="folder with llama.cpp's llama-bench (skipped when absent)")
    ap.add_argument("--bandwidth", type=float, default=35.0, help="GB/s the threads can stream")
    args = ap.parse_args()
    if not args.model.exists():
        raise SystemExit(f"{args.model} is missing: python scripts/make_bench_model.py --arch qwen3moe")
    peer = args.peer_bin if (args.peer_bin / "llama-bench").exists() else None
    if peer is None:
        print(f"no llama-bench in {args.peer_bin}: modelyard's figures only", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "engine")],
                   capture_output=True, check=False)
    ours: list[dict] = []
    theirs: list[dict] = []
    for r in range(args.rounds):
        ours.append(run_ours(args.model, args.threads, args.batch))
        if peer is not None:
            theirs.append(run_peer(peer, args.model, args.threads))
        print(f"round {r + 1}/{args.rounds}: ours {json.dumps(ours[-1])} llama.cpp "
              f"{json.dumps(theirs[-1]) if theirs else '-'}", file=sys.stderr, flush=True)

    def med(runs: list[dict], key: str) -> float | None:
        values = [run[key] for run in runs if key in run]
        return statistics.median(values) if values else None

    print(f"model: {args.model.name}; {args.threads} threads; {args.rounds} rounds interleaved, "
          f"medians; ratio = modelyard / llama.cpp")
    print(f"{'figure':34s} {'modelyard':>10s} {'llama.cpp':>10s} {'ratio':>7s}")
    for title, key in (("decode tok/s (128 after 8)", "decode"),
                       ("prefill tok/s (512 prompt)", "prefill")):
        a, b = med(ours, key), med(theirs, key)
        ratio = f"{a / b:7.2f}" if a and b else f"{'-':>7s}"
        peer_s = f"{b:10.1f}" if b else f"{'-':>10s}"
        print(f"{title:34s} {a:10.1f} {peer_s} {ratio}")
    decode, batch = med(ours, "decode"), med(ours, "batch")
    assert decode is not None and batch is not None
    print(f"{f'{args.batch} sequences tok/s (all)':34s} {batch:10.1f} {'-':>10s} "
          f"{batch / decode:7.2f}  (x one sequence's decode)")
    active = ours[0]["active_bytes"]
    print(f"active weights per decode token: {active / 1e6:.1f} MB; modelyard "
          f"{active * decode / 1e9:.1f} GB/s"
          + (f", llama.cpp {active * (med(theirs, 'decode') or 0) / 1e9:.1f} GB/s" if theirs else "")
          + f" of ~{args.bandwidth:g} GB/s")
    print("raw:", json.dumps({"ours": ours, "llama.cpp": theirs}))


if __name__ == "__main__":
    main()
