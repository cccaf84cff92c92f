"""modelyard's engine against llama.cpp (llama-cpp-python) on the same model, side by side.

    python scripts/bench_compare.py [MODEL.gguf] [--rounds 5] [--threads 1 2]
                                    [--peer-python /opt/llama-venv/bin/python] [--no-kquant]
                                    [--vs-tree DIR]

MODEL is any GGUF file the engine serves (default: SmolLM2 from the cache), e.g. Gemma 3 270M:
    python scripts/bench_compare.py ~/.cache/modelyard/gemma-3-270m-q4_k_m.gguf --threads 2

Every measurement runs in a fresh process, engines interleaved (ours, peer, ours, peer, ...) so
that other load on the machine hits both alike; the table shows medians over --rounds and the
ratio ours/peer. Figures per process:
    load     seconds from before importing the engine to a loaded model (kernel cache warm)
    rss      resident MB right after loading
    prefill  tokens/s evaluating a 512-token prompt in a fresh context (best of 2)
    decode   tokens/s over 128 greedy tokens after an 8-token prompt: one token per forward
             call, argmax of its logits (the same loop on both sides)
llama.cpp is an optional peer, never a dependency: build it in its own venv with
    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36
Without it, only modelyard's figures are printed. The engine's bytecode is compiled first (as an
install would have it). With it, a Q4_K_M copy of the model is made
once with llama.cpp's quantizer (cached next to the model) and decode is compared on it too,
unless the model already is Q4_K_M.

`--vs-tree DIR` makes the peer another checkout of modelyard (e.g. `git worktree add /tmp/base
HEAD~1`): the same child code runs with DIR's engine, interleaved with this tree's, so a change
is measured against the commit before it ("no slowdown"). llama.cpp is then left out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_PEER = "/opt/llama-venv/bin/python"
REPO = Path(__file__).resolve().parents[1]
TEXT = ("The quick brown fox jumps over the lazy dog while the curious cat watches from the old "
        "wooden fence, thinking about dinner and the long winter ahead. ") * 40

# Each child prints one JSON line. Shared shape: load_s, rss_mb, prefill, decode.
OURS = r'''
import time
t0 = time.perf_counter()
import sys, json
import numpy as np
import engine
from engine.model import Chunk
path, threads, text, what = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
model = engine.load(path, n_ctx=1024, n_threads=threads)
load_s = time.perf_counter() - t0
rss = int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
tr = model.transformer
ids = model.tokenizer.encode(text)
out = {"load_s": load_s, "rss_mb": rss}
if "prefill" in what:
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
model.close()
print(json.dumps(out))
'''

PEER = r'''
import time
t0 = time.perf_counter()
import sys, json
import numpy as np
import llama_cpp
path, threads, text, what = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
llm = llama_cpp.Llama(path, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads,
                      n_threads_batch=threads, verbose=False)
load_s = time.perf_counter() - t0
rss = int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
ids = llm.tokenize(text.encode(), add_bos=False)
n_vocab = llm.n_vocab()
def last_logits():
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
out = {"load_s": load_s, "rss_mb": rss}
if "prefill" in what:
    best = 0.0
    for _ in range(2):
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids[:512])
        best = max(best, 512 / (time.perf_counter() - t))
    out["prefill"] = best
llm.reset()
llm.eval(ids[:8])
tok = int(np.argmax(last_logits()))
t = time.perf_counter()
for _ in range(128):
    llm.eval([tok])
    tok = int(np.argmax(last_logits()))
out["decode"] = 128 / (time.perf_counter() - t)
print(json.dumps(out))
'''

QUANTIZE = r'''
import sys, llama_cpp
src, dst = sys.argv[1].encode(), sys.argv[2].encode()
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
params.allow_requantize = True
params.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(src, dst, params))
'''


def run_child(python: str, code: str, model: Path, threads: int, what: str,
              cwd: Path = REPO) -> dict:
    """One measuring process; `python -c` puts `cwd` first on sys.path, so it runs cwd's engine."""
    proc = subprocess.run([python, "-c", code, str(model), str(threads), TEXT, what],
                          capture_output=True, text=True, cwd=cwd, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def kquant_copy(peer: str, model: Path) -> Path | None:
    """A Q4_K_M requantization of `model` by llama.cpp's quantizer, made once and cached."""
    dst = model.with_name(model.name.split(".")[0] + ".Q4_K_M.gguf")
    if not dst.exists():
        tmp = dst.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run([peer, "-c", QUANTIZE, str(model), str(tmp)], capture_output=True,
                              text=True, timeout=600)
        if proc.returncode != 0 or not tmp.exists():
            print(f"(could not make a Q4_K_M copy: {proc.stderr[-500:]})", file=sys.stderr)
            tmp.unlink(missing_ok=True)
            return None
        os.replace(tmp, dst)
    return dst


def first_request_ms(model: Path, threads: int) -> dict:
    """A fresh `modelyard serve` with the model unloaded (lazy): ms from sending a streaming chat
    request to its first content token, load included."""
    import socket
    import tempfile

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(f"models:\n  - model: {model}\n    aliases: [m]\n"
                          f"    n_ctx: 2048\n    n_threads: {threads}\n")
        server = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(config),
                                   "--port", str(port), "--no-watch"], cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(300):
                try:
                    httpx.get(url + "/health", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.05)
            body = {"model": "m", "stream": True, "max_tokens": 4,
                    "messages": [{"role": "user", "content": "Hi"}]}
            t0 = time.perf_counter()
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if '"content":"' in line and '"content":""' not in line:
                        return {"first_request_ms": 1000 * (time.perf_counter() - t0)}
            return {}
        finally:
            server.terminate()
            server.wait()


def median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="GGUF file (default: SmolLM2 from the cache)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--peer-python", default=DEFAULT_PEER if os.path.exists(DEFAULT_PEER) else None,
                    help=f"python of a venv with llama-cpp-python (default: {DEFAULT_PEER} if present)")
    ap.add_argument("--no-kquant", action="store_true", help="skip the Q4_K_M decode comparison")
    ap.add_argument("--vs-tree", type=Path, help="peer: another modelyard checkout (not llama.cpp)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    if args.model is None:
        from engine.default_model import default_model_path
        args.model = str(default_model_path())
    model = Path(args.model)
    from engine.gguf import read_header
    meta, _ = read_header(model)
    arch, file_type = meta.get("general.architecture"), meta.get("general.file_type")
    peer = None if args.vs_tree else args.peer_python
    if peer and not os.path.exists(peer):
        print(f"peer python {peer} does not exist")
        peer = None
    if peer is None and args.vs_tree is None:
        print("llama.cpp peer missing (see --peer-python): modelyard's figures only")

    # an installed package has its bytecode compiled; an editable checkout run with
    # PYTHONDONTWRITEBYTECODE would compile every module in every fresh process instead
    for tree in (REPO, args.vs_tree) if args.vs_tree else (REPO,):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "engine")],
                       capture_output=True, check=False)
    jobs: list[tuple[str, Path, str]] = [("main", model, "prefill")]
    if peer and not args.no_kquant and file_type != 15:  # 15: already LLAMA_FTYPE_MOSTLY_Q4_K_M
        kq = kquant_copy(peer, model)
        if kq is not None:
            jobs.append(("Q4_K_M", kq, "decode"))
    results: dict[tuple[str, int, str], list[dict]] = {}
    engines = [("ours", sys.executable, OURS, REPO)]
    if peer:
        engines.append(("peer", peer, PEER, REPO))
    elif args.vs_tree:
        engines.append(("peer", sys.executable, OURS, args.vs_tree.resolve()))
    for r in range(args.rounds):
        for label, path, what in jobs:
            for threads in args.threads:
                for name, python, code, cwd in engines:  # interleaved: ours, peer, ours, ...
                    res = run_child(python, code, path, threads, what, cwd)
                    results.setdefault((label, threads, name), []).append(res)
        threads = args.threads[-1]
        results.setdefault(("lazy", threads, "ours"), []).append(first_request_ms(model, threads))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    peer_name = args.vs_tree.name if args.vs_tree else "llama.cpp"
    print(f"model: {model.name} ({arch}); {args.rounds} rounds, medians; ratio = ours / "
          f"{args.vs_tree or peer_name}")
    print(f"{'figure':36s} {'threads':>7s} {'modelyard':>10s} {peer_name[-10:]:>10s} {'ratio':>7s}")
    rows = [("decode tok/s (128 after 8)", "main", "decode"),
            ("prefill tok/s (512 prompt)", "main", "prefill"),
            ("load s (kernel cache warm)", "main", "load_s"),
            ("RSS MB after load", "main", "rss_mb"),
            ("Q4_K_M decode tok/s", "Q4_K_M", "decode"),
            ("first request ms, lazy load (server)", "lazy", "first_request_ms")]
    for title, label, key in rows:
        for threads in args.threads:
            if key in ("load_s", "rss_mb", "first_request_ms") and threads != args.threads[-1]:
                continue
            ours = median(results.get((label, threads, "ours"), []), key)
            theirs = median(results.get((label, threads, "peer"), []), key)
            if ours is None:
                continue
            fmt = "{:10.3f}" if key == "load_s" else "{:10.1f}"
            peer_s = fmt.format(theirs) if theirs is not None else f"{'-':>10s}"
            ratio = f"{ours / theirs:7.2f}" if theirs else f"{'-':>7s}"
            print(f"{title:36s} {threads:7d} {fmt.format(ours)} {peer_s} {ratio}")
    print("raw:", json.dumps({f"{k[0]}/{k[1]}/{k[2]}": v for k, v in results.items()}))


if __name__ == "__main__":
    main()
