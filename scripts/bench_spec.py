"""Speculative decoding's speed: prompt lookup on a copy-edit task, against plain decoding and
against llama-cpp-python's own prompt-lookup decoding.

    flock /tmp/modelyard-bench.lock python scripts/bench_spec.py [MODEL.gguf] [--rounds 5]
        [--threads 2] [--max-tokens 256] [--n-draft 8] [--peer-python /opt/llama-venv/bin/python]

The task: a base model (default Gemma 3 270M Q4_K_M from the cache) is given a ~400-token file,
a blank line and the file's first lines again, and continues the copy at temperature 0 through
/v1/completions. Three sides, each in a process of its own, kept loaded and measured in turn
(ours plain, ours lookup, peer lookup, ours plain, ...), so other load on the machine hits all
alike:
    plain    modelyard, the entry's `draft: {lookup: ngram}` switched off per request
             ("speculative": false)
    lookup   modelyard with drafting (the same server, the same loaded model)
    peer     llama-cpp-python in-process: Llama(..., draft_model=LlamaPromptLookupDecoding(
             num_pred_tokens=10)), what its server's `draft_model` key builds; create_completion
With --draft, a draft model instead: SmolLM2-135M Q4_1 (the default file) drafts for the same
model converted to F16 with gguf-py (scripts/to_f16.py; cached next to it), on a story prompt;
`plain` is the F16 model alone, `draft` with `draft: {model: Q4_1, n_draft}`; no peer.

Each side answers one warm-up request first (so the prompt is cached on both engines: what is
timed is the decode), then per round one request; tokens/s = completion tokens / wall seconds of
the request. The table shows medians and ratios; ours must give the same text plain and drafted.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path.home() / ".cache/modelyard/gemma-3-270m-q4_k_m.gguf"
DEFAULT_PEER = "/opt/llama-venv/bin/python"
SOURCE = REPO / "engine/draft.py"   # the file copied (about 400 tokens of its opening)
HEAD_LINES = 3
DEFAULT_DRAFT = Path.home() / ".cache/modelyard/SmolLM2-135M-Instruct.Q4_1.gguf"
STORY = ("Once upon a time, in a small village at the edge of a great forest, there lived an old "
         "clockmaker and his granddaughter. Every morning")

PEER = r'''
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
path, threads, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), logits_all=True,
            verbose=False)  # logits_all: as its server sets it (its drafting needs every row)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    t = time.perf_counter()
    out = llm.create_completion(req["prompt"], max_tokens=req["max_tokens"], temperature=0.0,
                                top_k=1, repeat_penalty=1.0)
    dt = time.perf_counter() - t
    print(json.dumps({"seconds": dt, "tokens": out["usage"]["completion_tokens"],
                      "text": out["choices"][0]["text"]}), flush=True)
'''


def copy_task(n_chars: int = 1400) -> str:
    """The file's opening (whole lines, about 400 tokens), a blank line, its first lines again."""
    text = SOURCE.read_text()
    cut = text.rfind("\n", 0, n_chars) + 1
    body = text[:cut]
    return body + "\n\n" + "".join(body.splitlines(keepends=True)[:HEAD_LINES])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ours:
    def __init__(self, model: Path, threads: int, draft: dict[str, Any], folder: Path) -> None:
        self.port = free_port()
        config = folder / "bench_spec.yaml"
        config.write_text(json.dumps({"port": self.port, "host": "127.0.0.1", "models": [{
            "model": str(model), "aliases": ["m"], "n_ctx": 2048, "n_parallel": 1,
            "n_threads": threads, "draft": draft}]}))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                                      str(config)], cwd=REPO, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=600)
        for _ in range(600):
            try:
                if self.client.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit("modelyard did not start")
            time.sleep(0.2)

    def run(self, prompt: str, max_tokens: int, speculative: bool) -> dict[str, Any]:
        t = time.perf_counter()
        r = self.client.post("/v1/completions", json={
            "model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "speculative": speculative})
        dt = time.perf_counter() - t
        r.raise_for_status()
        body = r.json()
        return {"seconds": dt, "tokens": body["usage"]["completion_tokens"],
                "text": body["choices"][0]["text"]}

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)


class Peer:
    def __init__(self, python: str, model: Path, threads: int) -> None:
        self.proc = subprocess.Popen([python, "-c", PEER, str(model), str(threads), "2048"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        json.loads(self.proc.stdout.readline())

    def run(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"prompt": prompt, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())  # type: ignore[no-any-return]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--n-draft", type=int, default=8)
    ap.add_argument("--peer-python", default=DEFAULT_PEER)
    ap.add_argument("--p-min", type=float, default=0.0, help="the draft model's p_min")
    ap.add_argument("--draft", action="store_true",
                    help="a draft model (MODEL, default SmolLM2 Q4_1) for its F16 copy")
    args = ap.parse_args()

    fast = "draft" if args.draft else "lookup"
    if args.draft:
        small = args.model if args.model != DEFAULT_MODEL else DEFAULT_DRAFT
        target = small.with_name(small.stem + ".F16-copy.gguf")
        if not target.exists():
            subprocess.run([sys.executable, str(REPO / "scripts/to_f16.py"), str(small),
                            str(target)], check=True)
        served, prompt = target, STORY
        draft = {"model": str(small), "n_draft": args.n_draft, "p_min": args.p_min}
        peer_python = ""
    else:
        served, draft = args.model, {"lookup": "ngram", "n_draft": args.n_draft}
        prompt, peer_python = copy_task(), args.peer_python
    with tempfile.TemporaryDirectory() as tmp:
        ours = Ours(served, args.threads, draft, Path(tmp))
        peer = Peer(peer_python, served, args.threads) if peer_python and Path(
            peer_python).exists() else None
        try:
            sides: dict[str, Any] = {
                "plain": lambda: ours.run(prompt, args.max_tokens, False),
                fast: lambda: ours.run(prompt, args.max_tokens, True)}
            if peer is not None:
                sides["peer lookup"] = lambda: peer.run(prompt, args.max_tokens)
            for run in sides.values():
                run()  # warm-up: the prompt cached, kernels loaded
            rates: dict[str, list[float]] = {name: [] for name in sides}
            texts: dict[str, str] = {}
            for r in range(args.rounds):
                for name, run in sides.items():
                    out = run()
                    rates[name].append(out["tokens"] / out["seconds"])
                    texts[name] = out["text"]
                print(f"round {r + 1}: " + "  ".join(f"{n} {v[-1]:.1f}" for n, v in rates.items()),
                      flush=True)
        finally:
            ours.close()
            if peer is not None:
                peer.close()
    med = {name: statistics.median(v) for name, v in rates.items()}
    print(f"\n{served.name}, {args.threads} threads, {args.max_tokens} tokens, "
          f"{args.rounds} rounds, medians (tokens/s):")
    for name, v in med.items():
        print(f"  {name:12s} {v:8.1f}")
    print(f"  {fast} / plain        {med[fast] / med['plain']:.2f}  (bar "
          f"{1.6 if args.draft else 2.0})")
    if "peer lookup" in med:
        print(f"  lookup / peer lookup  {med['lookup'] / med['peer lookup']:.2f}  (bar 2.5)")
        print(f"  peer lookup / plain   {med['peer lookup'] / med['plain']:.2f}")
    print(f"  same text plain and drafted: {texts['plain'] == texts[fast]}")
    if "peer lookup" in texts:
        print(f"  same text as the peer: {texts['plain'] == texts['peer lookup']}")


if __name__ == "__main__":
    main()
