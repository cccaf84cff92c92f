"""Make the 1.1B-parameter benchmark models: a random-weight llama of TinyLlama's shape.

    python scripts/make_bench_model.py [--out ~/.cache/modelyard/bench] [--vocab-from SmolLM2.gguf]
                                       [--peer-python /opt/llama-venv/bin/python] [--layers 22]

Writes bench-1.1b.F16.gguf with gguf.GGUFWriter (n_embd 2048, 22 layers, 32 heads / 4 KV heads,
n_ff 5632, weights ~ N(0, 0.02), norms ~ 1), with a real tokenizer: the tokenizer.ggml.* and chat
template metadata of SmolLM2 (49152 tokens), so prompts tokenize as they would for a real model.
Then llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize, run by --peer-python, a
benchmark peer and never a modelyard dependency) makes bench-1.1b.Q4_K_M.gguf and
bench-1.1b.Q8_0.gguf next to it, so the quantization mix is exactly llama.cpp's. Existing files
are kept. Random weights give meaningless text; the benchmarks only need the shapes and types.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

# TinyLlama-1.1B's hyperparameters
SHAPE = {"n_embd": 2048, "n_layer": 22, "n_head": 32, "n_head_kv": 4, "n_ff": 5632,
         "n_ctx_train": 2048}
PREFIX = "bench-1.1b"
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


def write_f16(path: Path, vocab_from: Path, n_layer: int, seed: int = 0) -> None:
    import gguf  # noqa: PLC0415

    s = SHAPE
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # renamed when complete
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("modelyard bench 1.1B (random weights)")
    w.add_block_count(n_layer)
    w.add_context_length(s["n_ctx_train"])
    w.add_embedding_length(s["n_embd"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(s["n_embd"] // s["n_head"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    n_vocab = _copy_tokenizer(w, vocab_from)
    w.add_vocab_size(n_vocab)
    E, F = s["n_embd"], s["n_ff"]
    kv = E // s["n_head"] * s["n_head_kv"]

    def matrix(name: str, n_rows: int, n_cols: int) -> None:
        # generated in f32 a slice at a time (1.1B values at once would need 4.4 GB)
        out = np.empty((n_rows, n_cols), np.float16)  # [rows, cols] = ggml [ne1, ne0]
        for r in range(0, n_rows, 4096):
            out[r:r + 4096] = rng.standard_normal((min(4096, n_rows - r), n_cols), np.float32) * 0.02
        w.add_tensor(name, out)

    def norm(name: str) -> None:
        w.add_tensor(name, (1.0 + 0.05 * rng.standard_normal(E)).astype(np.float32))

    matrix("token_embd.weight", n_vocab, E)
    for i in range(n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        matrix(p + "attn_q.weight", E, E)
        matrix(p + "attn_k.weight", kv, E)
        matrix(p + "attn_v.weight", kv, E)
        matrix(p + "attn_output.weight", E, E)
        norm(p + "ffn_norm.weight")
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


def quantize(peer: str, src: Path, dst: Path, ftype: str) -> None:
    tmp = dst.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run([peer, "-c", QUANTIZE, str(src), str(tmp), ftype],
                          capture_output=True, text=True)
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
    ap.add_argument("--layers", type=int, default=SHAPE["n_layer"])
    ap.add_argument("--types", default="Q4_K_M,Q8_0")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    f16 = args.out / f"{PREFIX}.F16.gguf"
    if not f16.exists():
        print(f"writing {f16}", file=sys.stderr)
        write_f16(f16, args.vocab_from, args.layers)
    for ftype in args.types.split(","):
        dst = args.out / f"{PREFIX}.{ftype}.gguf"
        if not dst.exists():
            print(f"quantizing {dst.name} with llama.cpp", file=sys.stderr)
            quantize(args.peer_python, f16, dst, ftype)
        print(dst)


if __name__ == "__main__":
    main()
