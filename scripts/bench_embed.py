"""Embedding and rerank throughput of a BERT-base-sized encoder against llama.cpp's server.

    flock /tmp/modelyard-bench.lock python scripts/bench_embed.py \
        [--peer-bin /work/llama/build/bin] [--out ~/.cache/modelyard/bench-embed] \
        [--rounds 3] [--threads 2] [--docs 256] [--rerank-docs 64]

Makes (once, kept in --out) a random-weight BERT of bert-base's shape (12 layers, 768 wide, 12
heads, FFN 3072, context 512) with a WordPiece vocabulary of 30522 tokens, as F16, then Q8_0 by
llama.cpp's own quantizer (llama-quantize from --peer-bin, a benchmark peer and never a
modelyard dependency), and the same model with a cross-encoder head (cls, cls.output,
pooling rank) for rerank. Weights ~ N(0, 0.02), LayerNorms 1 / 0; random weights give
meaningless vectors, the benchmark needs only the shapes and types.

Both sides are servers answering the same HTTP requests, started once each and measured
interleaved (ours, peer, ours, peer, ...), medians reported:
  embed   POST /v1/embeddings with --docs documents of 128 tokens ([CLS] + 126 words + [SEP])
          in one request: documents per second
  rerank  POST /v1/rerank with one query (14 tokens) and --rerank-docs documents of 113 words
          (pairs of 128 tokens): documents per second
ours: `modelyard serve` on a config of the three files (n_threads --threads); the peer:
llama-server --embeddings (or --reranking) -t --threads, -c 16384 -np 32 -b 4096 -ub 4096 (32
documents of 128 tokens per forward; its defaults would run 4), flash attention as it chooses.
Each side warms up with a request of 32 documents first (ours loads the model then). Run it
on a quiet machine: the figures of a shared one are only ratios taken in one run.
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

import numpy as np

SHAPE = {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_ff": 3072, "n_ctx": 512, "n_vocab": 30522}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DOC_WORDS = 126


def _vocab(n_vocab: int, rng: np.random.Generator) -> list[str]:
    """WordPiece pieces in llama.cpp's form: specials, letters and digits (word-initial "▁c" and
    continuation "c"), then random lowercase whole words "▁word" up to n_vocab."""
    chars = "abcdefghijklmnopqrstuvwxyz0123456789"
    out = SPECIALS + ["\u2581" + c for c in chars] + list(chars) + ["\u2581" + c for c in ".,?!"]
    seen = set(out)
    while len(out) < n_vocab:
        word = "\u2581" + "".join(rng.choice(list(chars[:26]), size=int(rng.integers(3, 9))))
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


def write_bert(path: Path, rerank: bool, seed: int = 7) -> None:
    import gguf  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    s = SHAPE
    E, F, V = s["n_embd"], s["n_ff"], s["n_vocab"]
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name("bench bert-base" + (" reranker" if rerank else ""))
    w.add_context_length(s["n_ctx"])
    w.add_embedding_length(E)
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(F)
    w.add_head_count(s["n_head"])
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK if rerank else gguf.PoolingType.MEAN)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens = _vocab(V, rng)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (V - len(SPECIALS)))
    w.add_token_type_count(2)
    w.add_unk_token_id(1)
    w.add_sep_token_id(3)
    w.add_pad_token_id(0)
    w.add_mask_token_id(4)
    w.add_bos_token_id(2)
    w.add_eos_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)

    def mat(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, (rng.standard_normal((rows, cols), np.float32) * 0.02).astype(np.float16))

    def vec(name: str, n: int, value: float | None = None) -> None:
        v = np.full(n, value, np.float32) if value is not None else \
            (rng.standard_normal(n, np.float32) * 0.02).astype(np.float32)
        w.add_tensor(name, v)

    mat("token_embd.weight", V, E)
    w.add_tensor("token_types.weight", (rng.standard_normal((2, E), np.float32) * 0.02))
    w.add_tensor("position_embd.weight", (rng.standard_normal((s["n_ctx"], E), np.float32) * 0.02))
    vec("token_embd_norm.weight", E, 1.0)
    vec("token_embd_norm.bias", E, 0.0)
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            mat(b + t + ".weight", E, E)
            vec(b + t + ".bias", E)
        vec(b + "attn_output_norm.weight", E, 1.0)
        vec(b + "attn_output_norm.bias", E, 0.0)
        mat(b + "ffn_up.weight", F, E)
        vec(b + "ffn_up.bias", F)
        mat(b + "ffn_down.weight", E, F)
        vec(b + "ffn_down.bias", E)
        vec(b + "layer_output_norm.weight", E, 1.0)
        vec(b + "layer_output_norm.bias", E, 0.0)
    if rerank:
        mat("cls.weight", E, E)
        vec("cls.bias", E)
        mat("cls.output.weight", 1, E)
        vec("cls.output.bias", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_models(out: Path, peer_bin: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = {"f16": out / "bench-bert-base.F16.gguf", "q8_0": out / "bench-bert-base.Q8_0.gguf",
             "rerank": out / "bench-bert-base-rerank.F16.gguf"}
    if not files["f16"].exists():
        write_bert(files["f16"], rerank=False)
    if not files["rerank"].exists():
        write_bert(files["rerank"], rerank=True)
    if not files["q8_0"].exists():
        subprocess.run([str(peer_bin / "llama-quantize"), str(files["f16"]), str(files["q8_0"]),
                        "Q8_0", "2"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return files


def documents(n: int, words: int, seed: int) -> list[str]:
    """n texts of `words` whole-word pieces each (one token per word)."""
    rng = np.random.default_rng(seed)
    vocab = [t[1:] for t in _vocab(SHAPE["n_vocab"], np.random.default_rng(7))
             if t.startswith("\u2581") and len(t) > 3]
    return [" ".join(rng.choice(vocab, size=words)) for _ in range(n)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    import httpx  # noqa: PLC0415

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(url)


class Side:
    """One server: started once, asked the same requests as the other."""

    def __init__(self, name: str, argv: list[str], port: int, env: dict[str, str] | None = None):
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=env)
        _wait(self.url, self.proc)

    def post(self, path: str, body: dict[str, object]) -> float:
        import httpx  # noqa: PLC0415

        started = time.perf_counter()
        r = httpx.post(self.url + path, json=body, timeout=3600)
        elapsed = time.perf_counter() - started
        if r.status_code != 200:
            raise RuntimeError(f"{self.name} {path}: {r.status_code} {r.text[:300]}")
        return elapsed

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def ours(files: dict[str, Path], threads: int, port: int, folder: Path) -> Side:
    config = {"models": [
        {"aliases": [kind], "model": str(path), "n_ctx": 512, "n_threads": threads,
         "n_parallel": 32} for kind, path in files.items()]}
    path = folder / "bench-embed.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return Side("modelyard", [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path),
                              "--port", str(port)], port, env)


def peer(peer_bin: Path, model: Path, rerank: bool, threads: int, port: int) -> Side:
    argv = [str(peer_bin / "llama-server"), "-m", str(model), "--port", str(port), "-t",
            str(threads), "-tb", str(threads), "-c", "16384", "-np", "32", "-b", "4096",
            "-ub", "4096", "--no-webui"]
    argv.append("--reranking" if rerank else "--embeddings")
    return Side("llama.cpp", argv, port)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--peer-bin", type=Path, default=Path("/work/llama/build/bin"))
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache/modelyard/bench-embed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--docs", type=int, default=256)
    ap.add_argument("--rerank-docs", type=int, default=64)
    ap.add_argument("--only", choices=("f16", "q8_0", "rerank"), action="append")
    args = ap.parse_args()
    files = make_models(args.out, args.peer_bin)
    docs = documents(args.docs, DOC_WORDS, seed=1)
    rdocs = documents(args.rerank_docs, 113, seed=2)  # [CLS] q(12) [SEP] d(113) [SEP]: 128
    query = documents(1, 12, seed=3)[0]
    kinds = args.only or ["f16", "q8_0", "rerank"]
    with tempfile.TemporaryDirectory() as tmp:
        our = ours({k: files[k] for k in kinds}, args.threads, _free_port(), Path(tmp))
        try:
            for kind in kinds:
                rerank = kind == "rerank"
                other = peer(args.peer_bin, files[kind], rerank, args.threads, _free_port())
                try:
                    path, n = ("/v1/rerank", len(rdocs)) if rerank else ("/v1/embeddings", len(docs))

                    def body(alias: str, rerank: bool = rerank, n: int | None = None
                             ) -> dict[str, object]:
                        return ({"model": alias, "query": query, "documents": rdocs[:n]} if rerank
                                else {"model": alias, "input": docs[:n]})

                    for side in (our, other):
                        side.post(path, body(kind, n=32))  # warm-up (loads ours): one batch
                    times: dict[str, list[float]] = {"modelyard": [], "llama.cpp": []}
                    for _ in range(args.rounds):
                        for side in (our, other):
                            times[side.name].append(side.post(path, body(kind)))
                    med = {k: n / statistics.median(v) for k, v in times.items()}
                    print(f"{kind:7s} {n:4d} docs  modelyard {med['modelyard']:7.1f} docs/s  "
                          f"llama.cpp {med['llama.cpp']:7.1f} docs/s  ratio "
                          f"{med['modelyard'] / med['llama.cpp']:.2f}  "
                          f"(s per round: ours {[round(t, 2) for t in times['modelyard']]}, "
                          f"peer {[round(t, 2) for t in times['llama.cpp']]})", flush=True)
                finally:
                    other.stop()
        finally:
            our.stop()


if __name__ == "__main__":
    main()
