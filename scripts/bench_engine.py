"""Engine speed on one model: prints one JSON line.

    python scripts/bench_engine.py MODEL.gguf [--threads 1 2] [--repeat 3] [--batch 8]

For each thread count, a fresh process loads the model (kernel cache warm after the first run) and
measures: load seconds, prefill tokens/s at 128 and 512 prompt tokens, decode tokens/s over 128
tokens after a short prompt (`decode_tok_s` through Model.stream, sampler included;
`decode_forward_tok_s` one forward call and an argmax per token, as bench_compare.py measures
it), batched decode (`decode_batch<B>_tok_s`: B sequences of 100 cached tokens each decoding
together, one forward call per step for all of them, tokens of all sequences per second, as the
server's continuous batching runs them), and peak RSS. Figures are medians over --repeat runs in
that process.

What bounds them: `decode_bytes_per_token` is what one decode step reads (every matmul weight
once, repacked sizes where repacked, plus the KV cache rows of a short context), so
`decode_gb_s` = bytes x decode_forward_tok_s, and `decode_of_bw_limit` its fraction of
--bandwidth (GB/s the threads can stream; ~35 on the 2-core AMD EPYC (Zen 4) test host, about 29 for
one thread). `prefill_tops` = 2 x multiply-adds per token (matmuls only) x prefill512_tok_s,
and `prefill_of_int8_peak` its fraction of the int8 peak measured here (a loop of independent
512-bit vpdpbusd per thread, on AVX-512 VNNI hosts; 64 multiply-adds each).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def measure(model_path: str, threads: int, repeat: int, batch: int, bandwidth: float) -> dict:
    t0 = time.perf_counter()
    import numpy as np  # noqa: PLC0415

    import engine  # noqa: PLC0415 - the import is part of what a cold start costs
    from engine.model import Chunk  # noqa: PLC0415

    model = engine.load(model_path, n_ctx=1024, n_threads=threads, n_slots=batch)
    load_s = time.perf_counter() - t0
    text = ("The quick brown fox jumps over the lazy dog while the curious cat watches from "
            "the old wooden fence, thinking about dinner and the long winter ahead. ") * 40
    ids = model.tokenizer.encode(text)
    out = {"threads": threads, "load_s": round(load_s, 4)}
    for n in (128, 512):
        runs = []
        for _ in range(repeat):
            model.transformer.cache.tokens[0] = []
            t = time.perf_counter()
            model._prefill(ids[:n], 0, "last")
            runs.append(n / (time.perf_counter() - t))
        out[f"prefill{n}_tok_s"] = round(statistics.median(runs), 1)
    runs = []
    for _ in range(repeat):
        model.transformer.cache.tokens[0] = []
        stream = model.stream(ids[:8], engine.SamplingParams(temperature=0.0), 129,
                              stop_at_eog=False)
        next(stream)  # prefill + first token
        t = time.perf_counter()
        n = sum(1 for _ in stream)
        runs.append(n / (time.perf_counter() - t))
    out["decode_tok_s"] = round(statistics.median(runs), 1)
    tr = model.transformer
    runs = []
    for _ in range(repeat):
        tr.cache.tokens[0] = []
        tok = int(np.argmax(tr.forward([Chunk(0, ids[:8], 0)], "last")[0]))
        t = time.perf_counter()
        for i in range(128):
            tok = int(np.argmax(tr.forward([Chunk(0, [tok], 8 + i)], "last")[0]))
        runs.append(128 / (time.perf_counter() - t))
    out["decode_forward_tok_s"] = round(statistics.median(runs), 1)
    runs = []
    for _ in range(repeat):
        for s in range(batch):  # B different prompts of 100 tokens
            tr.cache.tokens[s] = []
            tr.forward([Chunk(s, ids[s:s + 100], 0)], "last")
        toks = [ids[100 + s] for s in range(batch)]
        t = time.perf_counter()
        for i in range(64):
            logits = tr.forward([Chunk(s, [toks[s]], 100 + i) for s in range(batch)], "last")
            toks = [int(np.argmax(row)) for row in logits]
        runs.append(64 * batch / (time.perf_counter() - t))
    out[f"decode_batch{batch}_tok_s"] = round(statistics.median(runs), 1)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    mats = tr.weights.matrices()[1:]  # token_embd is looked up, not multiplied (the output is)
    read = sum(m.nbytes for m in mats) + tr.hp.kv_bytes_per_token() * 72  # ~72 cached tokens
    macs = sum(m.n_rows * m.n_cols for m in mats)
    out["decode_bytes_per_token"] = read
    out["decode_gb_s"] = round(read * out["decode_forward_tok_s"] / 1e9, 2)
    out["decode_of_bw_limit"] = round(out["decode_gb_s"] / bandwidth, 3)
    out["prefill_tops"] = round(2 * macs * out["prefill512_tok_s"] / 1e12, 3)
    peak = int8_peak_tops(threads)
    if peak:
        out["int8_peak_tops"] = round(peak, 3)
        out["prefill_of_int8_peak"] = round(out["prefill_tops"] / peak, 3)
    model.close()
    return out


def int8_peak_tops(threads: int) -> float | None:
    """TOPS of back-to-back independent 512-bit vpdpbusd on `threads` threads (None without
    AVX-512 VNNI)."""
    import ctypes  # noqa: PLC0415
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from engine.kernels import jit  # noqa: PLC0415
    from engine.kernels.ir.text import IRFunction  # noqa: PLC0415
    if not jit.host_has("avx512vnni"):
        return None
    accs = 12
    f = IRFunction("i32 @peak(i64 %n)")
    ones = "<i32 " + ", i32 ".join(["16843009"] * 16) + ">"
    final = f.loop("%n", [("<16 x i32>", "zeroinitializer")] * accs, lambda i, vs: [
        f.let(f"call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> {v}, <16 x i32> {ones}, "
              f"<16 x i32> {ones})") for v in vs])
    total = final[0]
    for v in final[1:]:
        total = f.let(f"add <16 x i32> {total}, {v}")
    f.do(f"ret i32 {f.let(f'extractelement <16 x i32> {total}, i64 0')}")
    lib = jit.compile_ir("declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, "
                         "<16 x i32>, <16 x i32>)\n" + f.text())
    fn = lib.function("peak", ctypes.c_int32, ctypes.c_int64)
    n = 5_000_000
    fn(n // 10)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:  # one thread each, all at once
            list(pool.map(fn, [n] * threads))
        best = min(best, time.perf_counter() - t)
    return threads * n * accs * 64 * 2 / best / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model", nargs="?", help="GGUF file (default: SmolLM2 from the cache)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="sequences decoding together")
    ap.add_argument("--bandwidth", type=float, default=35.0,
                    help="GB/s the threads can stream (decode_of_bw_limit's denominator)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model is None:
        from engine.default_model import default_model_path
        args.model = str(default_model_path())
    if args.child is not None:
        print(json.dumps(measure(args.model, args.child, args.repeat, args.batch, args.bandwidth)))
        return
    results = []
    for threads in args.threads:
        proc = subprocess.run([sys.executable, __file__, args.model, "--child", str(threads),
                               "--repeat", str(args.repeat), "--batch", str(args.batch),
                               "--bandwidth", str(args.bandwidth)],
                              capture_output=True, text=True, check=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(json.dumps({"model": Path(args.model).name, "runs": results}))


if __name__ == "__main__":
    main()
