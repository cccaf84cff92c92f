"""Make a Qwen3.5-shaped benchmark model: random weights, the hybrid DeltaNet / gated attention.

    python scripts/make_qwen35_bench_model.py [--out ~/.cache/modelyard/bench] [--layers 24]
                                              [--vocab-from SmolLM2.gguf]
                                              [--peer-python /opt/llama-venv/bin/python]
                                              [--types Q8_0]

Writes bench-qwen35.F16.gguf with gguf.GGUFWriter in the shape reported for Qwen3.5-0.8B
(n_embd 1024, 24 layers: three Gated DeltaNet layers to one gated attention layer; attention
8 heads / 2 KV heads of 256 with n_rot 64; DeltaNet 16 key and 16 value heads of 128, conv 4;
FFN 3584), with SmolLM2's tokenizer (49152 tokens: the real model's 248k vocabulary would make
the output matrix the benchmark). Norms, the conv, A and dt bias stay F32 as llama.cpp keeps
them. Then llama.cpp's quantizer (run by --peer-python, never a modelyard dependency) makes the
--types copies. Random weights give meaningless text; the benchmarks need only shapes and types:

    python scripts/bench_compare.py ~/.cache/modelyard/bench/bench-qwen35.Q8_0.gguf --threads 2
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from make_bench_model import _copy_tokenizer, quantize  # scripts/ is on sys.path when run

SHAPE = {"n_embd": 1024, "n_layer": 24, "n_head": 8, "n_head_kv": 2, "head_dim": 256,
         "n_rot": 64, "n_ff": 3584, "k_heads": 16, "v_heads": 16, "head": 128, "d_conv": 4,
         "interval": 4}
PREFIX = "bench-qwen35"


def write_f16(path: Path, vocab_from: Path, n_layer: int, seed: int = 0) -> None:
    import gguf  # noqa: PLC0415

    s = SHAPE
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    w = gguf.GGUFWriter(str(tmp), "qwen35")
    w.add_name("modelyard bench qwen35 (random weights)")
    a = "qwen35."
    E, F, hd = s["n_embd"], s["n_ff"], s["head_dim"]
    for key, value in (("context_length", 4096), ("embedding_length", E), ("block_count", n_layer),
                       ("feed_forward_length", F), ("attention.head_count", s["n_head"]),
                       ("attention.head_count_kv", s["n_head_kv"]), ("attention.key_length", hd),
                       ("attention.value_length", hd), ("rope.dimension_count", s["n_rot"]),
                       ("ssm.conv_kernel", s["d_conv"]), ("ssm.state_size", s["head"]),
                       ("ssm.group_count", s["k_heads"]), ("ssm.time_step_rank", s["v_heads"]),
                       ("ssm.inner_size", s["v_heads"] * s["head"]),
                       ("full_attention_interval", s["interval"])):
        w.add_uint32(a + key, value)
    w.add_float32(a + "rope.freq_base", 1e7)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_array(a + "rope.dimension_sections", [11, 11, 10, 0])
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    n_vocab = _copy_tokenizer(w, vocab_from)
    w.add_uint32(a + "vocab_size", n_vocab)
    key_dim, v_dim = s["k_heads"] * s["head"], s["v_heads"] * s["head"]

    def matrix(name: str, n_rows: int, n_cols: int, gain: float = 1.0) -> None:
        out = np.empty((n_rows, n_cols), np.float16)  # [rows, cols] = ggml [ne1, ne0]
        for r in range(0, n_rows, 4096):
            out[r:r + 4096] = rng.standard_normal((min(4096, n_rows - r), n_cols), np.float32) \
                * (gain / np.sqrt(n_cols))
        w.add_tensor(name, out)

    def floats(name: str, values: np.ndarray) -> None:
        w.add_tensor(name, values.astype(np.float32))

    def norm(name: str, n: int = E) -> None:
        floats(name, 1.0 + 0.05 * rng.standard_normal(n))

    matrix("token_embd.weight", n_vocab, E)
    for i in range(n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        norm(p + "post_attention_norm.weight")
        if (i + 1) % s["interval"]:
            matrix(p + "attn_qkv.weight", 2 * key_dim + v_dim, E)
            matrix(p + "attn_gate.weight", v_dim, E)
            floats(p + "ssm_conv1d.weight", 0.5 * rng.standard_normal((2 * key_dim + v_dim, s["d_conv"])))
            floats(p + "ssm_dt.bias", rng.standard_normal(s["v_heads"]))
            floats(p + "ssm_a", -np.exp(0.25 * rng.standard_normal(s["v_heads"]) - 0.5))
            matrix(p + "ssm_beta.weight", s["v_heads"], E)
            matrix(p + "ssm_alpha.weight", s["v_heads"], E)
            norm(p + "ssm_norm.weight", s["head"])
            matrix(p + "ssm_out.weight", E, v_dim)
        else:
            matrix(p + "attn_q.weight", 2 * s["n_head"] * hd, E)
            matrix(p + "attn_k.weight", s["n_head_kv"] * hd, E)
            matrix(p + "attn_v.weight", s["n_head_kv"] * hd, E)
            matrix(p + "attn_output.weight", E, s["n_head"] * hd)
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
        matrix(p + "ffn_gate.weight", F, E)
        matrix(p + "ffn_up.weight", F, E)
        matrix(p + "ffn_down.weight", E, F)
    norm("output_norm.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "modelyard" / "bench")
    ap.add_argument("--vocab-from", type=Path,
                    default=Path.home() / ".cache" / "modelyard" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--peer-python", default="/opt/llama-venv/bin/python")
    ap.add_argument("--layers", type=int, default=SHAPE["n_layer"])
    ap.add_argument("--types", default="Q8_0", help="comma-separated llama.cpp ftypes ('' for none)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    f16 = args.out / f"{PREFIX}.F16.gguf"
    if not f16.exists():
        print(f"writing {f16}", file=sys.stderr)
        write_f16(f16, args.vocab_from, args.layers)
    print(f16)
    for ftype in filter(None, args.types.split(",")):
        dst = args.out / f"{PREFIX}.{ftype}.gguf"
        if not dst.exists():
            print(f"quantizing {dst.name} with llama.cpp", file=sys.stderr)
            quantize(args.peer_python, f16, dst, ftype)
        print(dst)


if __name__ == "__main__":
    main()
