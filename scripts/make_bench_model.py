"""Make the benchmark models: a random-weight llama of TinyLlama's shape (1.1B), or with
`--arch qwen3moe` a mixture of experts with Qwen3-30B-A3B's ratios (2.6B total, 0.4B active).

    python scripts/make_bench_model.py [--arch llama|qwen3moe] [--out ~/.cache/modelyard/bench]
                                       [--vocab-from SmolLM2.gguf] [--layers N] [--types Q4_K_M,Q8_0]
                                       [--peer-python /opt/llama-venv/bin/python | --peer-bin DIR]

Writes bench-1.1b.F16.gguf with gguf.GGUFWriter (n_embd 2048, 22 layers, 32 heads / 4 KV heads,
n_ff 5632, weights ~ N(0, 0.02), norms ~ 1), with a real tokenizer: the tokenizer.ggml.* and chat
template metadata of SmolLM2 (49152 tokens), so prompts tokenize as they would for a real model.
Then llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize, run by --peer-python, a
benchmark peer and never a modelyard dependency) makes bench-1.1b.Q4_K_M.gguf and
bench-1.1b.Q8_0.gguf next to it, so the quantization mix is exactly llama.cpp's (--peer-bin DIR
runs DIR/llama-quantize instead). Existing files are kept. Random weights give meaningless text;
the benchmarks only need the shapes and types.

qwen3moe (bench-moe-2.6b.*): 24 layers of n_embd 1024, 16 heads of 64 (4 KV heads) with qwen3's
q/k norms, 64 experts of n_ff 512 with 8 used per token, a router N(0, 0.02) like the rest, so
tokens spread over the experts about evenly. Experts: 24 * 64 * 3 * 1024 * 512 = 2.42B weights;
read per token: 8 of 64 experts (0.30B) + attention (0.06B) + output (0.05B) = 0.41B.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

# TinyLlama-1.1B's hyperparameters; a qwen3moe at Qwen3-30B-A3B's ratios, scaled to build in minutes
SHAPES = {
    "llama": {"n_embd": 2048, "n_layer": 22, "n_head": 32, "n_head_kv": 4, "n_ff": 5632,
              "n_ctx_train": 2048},
    "qwen3moe": {"n_embd": 1024, "n_layer": 24, "n_head": 16, "n_head_kv": 4, "head_dim": 64,
                 "n_ff": 3072, "n_expert": 64, "n_expert_used": 8, "n_ff_exp": 512,
                 "n_ctx_train": 4096},
}
SHAPE = SHAPES["llama"]
PREFIXES = {"llama": "bench-1.1b", "qwen3moe": "bench-moe-2.6b"}
PREFIX = PREFIXES["llama"]
QUANTIZE = r'''
import sys
import llama_cpp
src, dst, ftype = sys.argv[1], sys.argv[2], sys.argv[3]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype)
params.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params))
'''


def _copy_tokenizer(writer, vocab_from: Path) -> int:
    """Copy tokenizer.ggml.* and the chat template from another GGUF; returns the vocab size."""
    import gguf  # noqa: PLC0415

    r = gguf.GGUFReader(str(vocab_from))
    n_vocab = 0
    for key, field in r.fields.items():
        if not (key.startswith("tokenizer.")):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            values = field.contents()
            writer.add_array(key, values)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(values)
        else:
            writer.add_key_value(key, field.contents(), vtype)
    if n_vocab == 0:
        raise SystemExit(f"{vocab_from} has no tokenizer.ggml.tokens")
    return n_vocab


def write_f16(path: Path, vocab_from: Path, n_layer: int, seed: int = 0,
              arch: str = "llama") -> None:
    import gguf  # noqa: PLC0415

    s = SHAPES[arch]
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # renamed when complete
    # use_temp_file: each tensor goes to disk as it is added (the MoE's F16 is 5 GB)
    w = gguf.GGUFWriter(str(tmp), arch, use_temp_file=True)
    w.add_name(f"modelyard bench {PREFIXES[arch]} (random weights)")
    w.add_block_count(n_layer)
    w.add_context_length(s["n_ctx_train"])
    w.add_embedding_length(s["n_embd"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    if arch == "llama":
        w.add_rope_freq_base(10000.0)
    head_dim = s.get("head_dim", s["n_embd"] // s["n_head"])
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
    if arch == "qwen3moe":
        w.add_rope_freq_base(1e6)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_expert_count(s["n_expert"])
        w.add_expert_used_count(s["n_expert_used"])
        w.add_expert_feed_forward_length(s["n_ff_exp"])
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    n_vocab = _copy_tokenizer(w, vocab_from)
    w.add_vocab_size(n_vocab)
    E, F = s["n_embd"], s["n_ff"]
    q, kv = head_dim * s["n_head"], head_dim * s["n_head_kv"]

    def matrix(name: str, *shape: int, dtype: type = np.float16) -> None:
        # generated in f32 a slice at a time (1.1B values at once would need 4.4 GB);
        # shape [.., rows, cols] = ggml [.., ne1, ne0]
        out = np.empty(shape, dtype).reshape(-1, shape[-1])
        for r in range(0, out.shape[0], 4096):
            n = min(4096, out.shape[0] - r)
            out[r:r + n] = rng.standard_normal((n, shape[-1]), np.float32) * 0.02
        w.add_tensor(name, out.reshape(shape))

    def norm(name: str, n: int = E) -> None:
        w.add_tensor(name, (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", n_vocab, E)
    for i in range(n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        matrix(p + "attn_q.weight", q, E)
        matrix(p + "attn_k.weight", kv, E)
        matrix(p + "attn_v.weight", kv, E)
        matrix(p + "attn_output.weight", E, q)
        norm(p + "ffn_norm.weight")
        if arch == "qwen3moe":
            norm(p + "attn_q_norm.weight", head_dim)
            norm(p + "attn_k_norm.weight", head_dim)
            X, G = s["n_expert"], s["n_ff_exp"]
            matrix(p + "ffn_gate_inp.weight", X, E, dtype=np.float32)  # the router stays F32
            matrix(p + "ffn_gate_exps.weight", X, G, E)
            matrix(p + "ffn_up_exps.weight", X, G, E)
            matrix(p + "ffn_down_exps.weight", X, E, G)
            continue
        matrix(p + "ffn_gate.weight", F, E)
        matrix(p + "ffn_up.weight", F, E)
        matrix(p + "ffn_down.weight", E, F)
    norm("output_norm.weight")
    matrix("output.weight", n_vocab, E)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    os.replace(tmp, path)


def quantize(peer: str, src: Path, dst: Path, ftype: str, peer_bin: Path | None = None) -> None:
    tmp = dst.with_suffix(f".{os.getpid()}.tmp")
    cmd = ([str(peer_bin / "llama-quantize"), str(src), str(tmp), ftype, "2"] if peer_bin
           else [peer, "-c", QUANTIZE, str(src), str(tmp), ftype])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama.cpp's quantizer failed for {ftype}:\n{proc.stderr[-2000:]}")
    os.replace(tmp, dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "modelyard" / "bench")
    ap.add_argument("--vocab-from", type=Path,
                    default=Path.home() / ".cache" / "modelyard" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--peer-python", default="/opt/llama-venv/bin/python")
    ap.add_argument("--peer-bin", type=Path, default=None,
                    help="a llama.cpp build's bin folder: its llama-quantize quantizes")
    ap.add_argument("--arch", choices=sorted(SHAPES), default="llama")
    ap.add_argument("--layers", type=int, default=None, help="default: the shape's")
    ap.add_argument("--types", default=None, help="default: Q4_K_M,Q8_0 (llama), Q4_K_M (qwen3moe)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prefix = PREFIXES[args.arch]
    f16 = args.out / f"{prefix}.F16.gguf"
    if not f16.exists():
        print(f"writing {f16}", file=sys.stderr)
        write_f16(f16, args.vocab_from, args.layers or SHAPES[args.arch]["n_layer"],
                  arch=args.arch)
    types = args.types or ("Q4_K_M,Q8_0" if args.arch == "llama" else "Q4_K_M")
    for ftype in types.split(","):
        dst = args.out / f"{prefix}.{ftype}.gguf"
        if not dst.exists():
            print(f"quantizing {dst.name} with llama.cpp", file=sys.stderr)
            quantize(args.peer_python, f16, dst, ftype, args.peer_bin)
        print(dst)


if __name__ == "__main__":
    main()
