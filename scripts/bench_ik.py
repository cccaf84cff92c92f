"""modelyard against ik_llama.cpp's llama-bench, interleaved, on the models of issue #36.

    python scripts/bench_ik.py --ik-src DIR | --ik-bin DIR [--rounds 3] [--threads 2]
        [--models smollm2,gemma3,bench1b] [--long 6000] [--ik-args "-rtr 1"]
        [--variant NAME:VAR=VALUE[,VAR=VALUE]]...

ik_llama.cpp (https://github.com/ikawrakow/ik_llama.cpp, the CPU fork with its own interleaved
"IQK" matmuls and flash attention) is a benchmark peer only, never a dependency: `--ik-src`
builds its llama-bench from a source tree with scripts/build_ik_llama.sh (cached by content,
so a rerun does not rebuild); `--ik-bin` takes a folder holding a built llama-bench. With
neither, the newest build under ~/.cache/modelyard/peers/ik_llama is used if there is one.

Models (`--models`, comma-separated; default all three):
    smollm2  ~/.cache/modelyard/SmolLM2-135M-Instruct.Q4_1.gguf
    gemma3   ~/.cache/modelyard/gemma-3-270m-q4_k_m.gguf
    bench1b  ~/.cache/modelyard/bench/bench-1.1b.Q4_K_M.gguf (random weights, llama shape;
             made by `python scripts/make_bench_model.py` with llama.cpp's quantizer)

Every round runs, per model, a fresh process of each engine in turn (ours, ik, then each
`--variant`), so that other load on the machine hits them alike; the table gives medians over
the rounds:
    prefill  tokens/s of a 512-token prompt in a fresh context, best of 2 (ik: pp512, best of
             its repetitions)
    decode   tokens/s over `--decode` (128) greedy tokens after an 8-token prompt, one forward
             per token (ik: tg128 from an empty context, median of its `--ik-reps` (3))
    long     tokens/s of a `--long`-token prompt (SmolLM2 only; 0 skips it) in 512-token chunks
             over the growing cache, as a server prefills it (ik: pp`--long` with its default
             batch 2048 / micro-batch 512, one repetition)
ik runs with its defaults (flash attention on, no run-time repack, OpenMP threads that spin
while they wait: on a machine where other jobs take the cores its decode collapses, 4 tok/s
against ~100 on SmolLM2, so only a quiet machine's figures compare the engines); `--ik-args`
adds flags (e.g. "-rtr 1" to repack its weights into its interleaved layouts at load).

`--variant NAME:ENV` adds another modelyard column run with environment variables set (e.g.
`--variant q41:MODELYARD_INTERLEAVED=Q8_0,Q4_0,Q4_1`), for A/B measurements in the same run.

int8 peak: prefill's integer work is the weight matrices' multiply-adds, 2 * (weights a token
is multiplied by: every layer matrix; the output matrix only for the last row, left out) int8
operations per token. The machine's peak (`peak_ops`) is ops per cycle per core x clock x cores:
AVX-512 VNNI issues two `vpdpbusd` on 512-bit vectors per cycle on a core with both 512-bit
FMA units (ports 0 and 5; Xeon Gold 6xxx and Platinum; one on others, which halves the peak),
2 x 64 multiply-adds = 256 int8 ops per cycle; AMX issues one `tdpbusd` (16 x 16 x 64
multiply-adds) per 16 cycles, 2048 ops per cycle. Clock: /proc/cpuinfo's nominal MHz (turbo,
if any, is not counted). The table prints the fraction of the VNNI peak (the instructions
modelyard's kernels run) and of the AMX peak.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "modelyard"
MODELS = {"smollm2": CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3": CACHE / "gemma-3-270m-q4_k_m.gguf",
          "bench1b": CACHE / "bench" / "bench-1.1b.Q4_K_M.gguf"}
IK_CACHE = CACHE / "peers" / "ik_llama"
TEXT = ("The quick brown fox jumps over the lazy dog while the curious cat watches from the old "
        "wooden fence, thinking about dinner and the long winter ahead. ") * 300

# One JSON line: prefill, decode, long (tokens/s), weight_macs (per token, layer matrices).
OURS = r'''
import sys, json, time
import numpy as np
import engine
from engine.kv import MAX_CHUNK
from engine.model import Chunk
path, text = sys.argv[1], sys.argv[3]
threads, n_long, n_gen = int(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5])
model = engine.load(path, n_ctx=max(1024, n_long + 16), n_threads=threads)
tr = model.transformer
ids = model.tokenizer.encode(text)
assert len(ids) >= max(n_long, 512), (len(ids), n_long)
out = {}
best = 0.0
for _ in range(2):
    tr.cache.truncate(0, 0)
    t = time.perf_counter()
    tr.forward([Chunk(0, ids[:512], 0)], "last")
    best = max(best, 512 / (time.perf_counter() - t))
out["prefill"] = best
tr.cache.truncate(0, 0)
tok = int(np.argmax(tr.forward([Chunk(0, ids[:8], 0)], "last")[0]))
t = time.perf_counter()
for i in range(n_gen):
    tok = int(np.argmax(tr.forward([Chunk(0, [tok], 8 + i)], "last")[0]))
out["decode"] = n_gen / (time.perf_counter() - t)
if n_long:
    tr.cache.truncate(0, 0)
    t = time.perf_counter()
    for a in range(0, n_long, MAX_CHUNK):
        b = min(a + MAX_CHUNK, n_long)
        tr.forward([Chunk(0, ids[a:b], a, logits=b == n_long)], "last")
    out["long"] = n_long / (time.perf_counter() - t)
macs = 0
for layer in tr.weights.layers:
    for m in vars(layer).values():
        if hasattr(m, "qtype") and hasattr(m, "n_rows"):  # a QuantMatrix or its repacked copy
            macs += m.n_rows * m.n_cols
out["weight_macs"] = macs
model.close()
print(json.dumps(out))
'''


def run_ours(model: Path, threads: int, n_long: int, n_gen: int, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", OURS, str(model), str(threads), TEXT, str(n_long),
                           str(n_gen)],
                          capture_output=True, text=True, cwd=REPO, timeout=3600,
                          env={**os.environ, **env})
    if proc.returncode != 0:
        raise RuntimeError(f"modelyard failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def llama_bench(ik_bin: Path, model: Path, threads: int, args: list[str], extra: list[str]) -> list:
    proc = subprocess.run([str(ik_bin / "llama-bench"), "-m", str(model), "-t", str(threads),
                           *args, "-o", "json", *extra], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"ik llama-bench failed:\n{proc.stderr[-3000:]}")
    return list(json.loads(proc.stdout))


def run_ik(ik_bin: Path, model: Path, threads: int, n_long: int, n_gen: int, reps: int,
           extra: list[str]) -> dict:
    out = {}
    for test in llama_bench(ik_bin, model, threads,
                            ["-p", "512", "-n", str(n_gen), "-r", str(reps)], extra):
        if test["n_prompt"]:
            out["prefill"] = max(test["samples_ts"])
        else:
            out["decode"] = statistics.median(test["samples_ts"])
    if n_long:
        test = llama_bench(ik_bin, model, threads, ["-p", str(n_long), "-n", "0", "-r", "1"], extra)[0]
        out["long"] = max(test["samples_ts"])
    return out


def find_ik(args: argparse.Namespace) -> Path | None:
    if args.ik_bin:
        return Path(args.ik_bin)
    if args.ik_src:
        proc = subprocess.run(["bash", str(REPO / "scripts" / "build_ik_llama.sh"), args.ik_src],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"building ik_llama.cpp failed:\n{proc.stderr[-3000:]}")
        return Path(proc.stdout.strip().splitlines()[-1])
    built = sorted(IK_CACHE.glob("*/bin/llama-bench"), key=lambda p: p.stat().st_mtime)
    return built[-1].parent if built else None


def cpu_mhz() -> float:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return float(line.split(":")[1])
    return float("nan")


def peaks(cores: int) -> dict[str, float]:
    """int8 ops per second: ops per cycle per core x clock x cores (see the module docstring)."""
    hz = cpu_mhz() * 1e6
    return {"vnni512": 256 * hz * cores, "amx": 2048 * hz * cores}


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assigns = text.partition(":")
    # a value may itself hold commas (a type list): a piece without "=" continues the last value
    env: dict[str, str] = {}
    key = None
    for piece in assigns.split(","):
        if "=" in piece:
            key, value = piece.split("=", 1)
            env[key] = value
        elif key is not None:
            env[key] += "," + piece
    return name, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ik-src", help="ik_llama.cpp source tree (built by scripts/build_ik_llama.sh)")
    ap.add_argument("--ik-bin", help="folder with a built ik_llama.cpp llama-bench")
    ap.add_argument("--no-ik", action="store_true", help="only modelyard (with --variant: an A/B)")
    ap.add_argument("--ik-args", default="", help="extra llama-bench flags for ik (e.g. '-rtr 1')")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--long", type=int, default=6000, help="long prompt on SmolLM2 (0: skip)")
    ap.add_argument("--decode", type=int, default=128, help="tokens decoded (ik: -n)")
    ap.add_argument("--ik-reps", type=int, default=3, help="llama-bench repetitions (-r)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE,...")
    args = ap.parse_args()
    names = [n for n in args.models.split(",") if n]
    for n in names:
        if n not in MODELS:
            raise SystemExit(f"unknown model {n!r}: one of {', '.join(MODELS)}")
        if not MODELS[n].exists():
            raise SystemExit(f"{MODELS[n]} is missing" + (": python scripts/make_bench_model.py"
                                                           if n == "bench1b" else ""))
    ik = None if args.no_ik else find_ik(args)
    if ik is None:
        print("no ik_llama.cpp llama-bench (--ik-src / --ik-bin): modelyard's figures only",
              file=sys.stderr)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "engine")],
                   capture_output=True, check=False)
    engines: list[tuple[str, dict[str, str] | None]] = [("ours", {})]
    if ik is not None:
        engines.append(("ik", None))
    engines += [parse_variant(v) for v in args.variant]
    results: dict[tuple[str, str], list[dict]] = {}
    extra = args.ik_args.split()
    for r in range(args.rounds):
        for n in names:
            n_long = args.long if n == "smollm2" else 0
            for label, env in engines:
                res = (run_ik(ik, MODELS[n], args.threads, n_long, args.decode, args.ik_reps, extra)
                       if env is None and ik
                       else run_ours(MODELS[n], args.threads, n_long, args.decode, env or {}))
                results.setdefault((n, label), []).append(res)
                print(f"round {r + 1}/{args.rounds} {n} {label}: {json.dumps(res)}",
                      file=sys.stderr, flush=True)

    def med(n: str, label: str, key: str) -> float | None:
        values = [run[key] for run in results.get((n, label), []) if key in run]
        return statistics.median(values) if values else None

    peak = peaks(args.threads)
    labels = [label for label, _ in engines]
    print(f"{args.threads} threads; {args.rounds} rounds interleaved, medians (tokens/s); "
          f"ratio = ours / ik" + ("; shared machine: compare within a run" if os.getloadavg()[0] >
                                  args.threads else ""))
    print(f"{'model':9s} {'figure':8s} " + " ".join(f"{x[:9]:>9s}" for x in labels)
          + f" {'ours/ik':>8s}  {'VNNI peak':>9s} {'AMX peak':>8s}  {'ik VNNI':>7s}")
    for n in names:
        macs = results[(n, "ours")][0]["weight_macs"]
        for key in ("prefill", "decode", "long"):
            vals = [med(n, label, key) for label in labels]
            if vals[0] is None:
                continue
            cells = " ".join(f"{v:9.1f}" if v is not None else f"{'-':>9s}" for v in vals)
            ours, theirs = vals[0], med(n, "ik", key)
            ratio = f"{ours / theirs:8.2f}" if theirs else f"{'-':>8s}"
            frac = ""
            if key == "prefill":
                ops = 2 * macs
                frac = (f"  {ours * ops / peak['vnni512']:9.1%} {ours * ops / peak['amx']:8.2%}"
                        + (f"  {theirs * ops / peak['vnni512']:7.1%}" if theirs else ""))
            print(f"{n:9s} {key:8s} {cells} {ratio}{frac}")
    print(f"int8 peak ({args.threads} cores at {cpu_mhz():.0f} MHz): VNNI-512 "
          f"{peak['vnni512'] / 1e9:.0f} GOPS (256 ops/cycle/core), AMX {peak['amx'] / 1e12:.1f} TOPS "
          f"(2048 ops/cycle/core); prefill ops/token = 2 x layer weights")
    print("raw:", json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}))


if __name__ == "__main__":
    main()
