"""llama.cpp's quantization mixes of a real model, through the engine and through llama.cpp.

    python scripts/compare_quant_mixes.py [MODEL.gguf] [--types Q2_K,Q3_K_M,IQ4_XS,IQ4_NL]
                                          [--peer-python /opt/llama-venv/bin/python]

llama.cpp's quantizer (a peer in its own venv, never a dependency; see bench_compare.py) makes
each mix from MODEL (requantizing is allowed: the point is the types, not the quality), cached
next to the model. Rows whose length is not a multiple of 256 cannot take a K-quant or IQ4_XS,
so small models get llama.cpp's fallbacks (Q4_0, Q5_0, IQ4_NL, Q8_0, ...) beside them: the
table lists the type counts. Logits of one prompt, flash attention off on both sides, are
compared with llama.cpp's own spread: its repacked CPU kernels against its plain ones.
    row0   max |diff| at position 0 (one key: attention is the identity), i.e. the matmuls
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

DEFAULT_MODEL = Path.home() / ".cache/modelyard/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The quick brown fox jumps over the lazy dog. In the beginning, there was a small model that"

PEER = r'''
import ctypes, json, sys
import numpy as np
import llama_cpp as L
src, dst, ftype, out, prompt = sys.argv[1:6]
if ftype != "-":
    p = L.llama_model_quantize_default_params()
    p.ftype, p.allow_requantize = getattr(L, "LLAMA_FTYPE_MOSTLY_" + ftype), True
    assert L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) == 0
res = {}
for repack in (True, False):
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = repack
    model = L.llama_model_load_from_file(dst.encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    buf = (L.llama_token * 512)()
    n = L.llama_tokenize(vocab, prompt.encode(), len(prompt.encode()), buf, 512, False, True)
    ids = list(buf[:n])
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch, cp.flash_attn_type = 256, 512, 2, 2, 0
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(n, 0, 1)
    batch.n_tokens = n
    for i, t in enumerate(ids):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, True
        batch.seq_id[i][0] = 0
    assert L.llama_decode(ctx, batch) == 0
    nv = L.llama_vocab_n_tokens(vocab)
    res["repack" if repack else "plain"] = np.array(
        [np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(nv,)) for i in range(n)])
    res["ids"] = np.array(ids)
np.savez(out, **res)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--types", default="Q2_K,Q3_K_M,IQ4_XS,IQ4_NL", help="llama.cpp ftype names")
    ap.add_argument("--peer-python", default="/opt/llama-venv/bin/python")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gguf

    import engine

    print(f"{args.model.name}, prompt of {len(PROMPT)} chars; |logit diff| vs llama.cpp (flash off)")
    print(f"{'mix':8s} {'max':>6s} {'mean':>6s} {'row0':>8s} {'top-1':>6s}  "
          f"{'llama.cpp repacked vs plain':>27s}  types")
    for ftype in args.types.split(","):
        dst = args.model.with_name(f"{args.model.stem}.as-{ftype}.gguf")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "ref.npz"
            cmd = [args.peer_python, "-c", PEER, str(args.model), str(dst),
                   "-" if dst.exists() else ftype, str(out), PROMPT]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ref = dict(np.load(out))
        ids = ref["ids"].tolist()
        with engine.load(dst, n_ctx=256, n_threads=2, flash_attn=False) as model:
            ours = model.logits(ids)  # [T, n_vocab]
        counts = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(dst)).tensors
                                     if len(t.shape) == 2)
        d = np.abs(ours - ref["plain"])
        top1 = int((ours.argmax(-1) == ref["plain"].argmax(-1)).sum())
        spread = np.abs(ref["repack"] - ref["plain"])
        print(f"{ftype:8s} {d.max():6.3f} {d.mean():6.3f} {d[0].max():8.1e} {top1:3d}/{len(ids):<3d}"
              f"  max {spread.max():5.2f} mean {spread.mean():5.3f} row0 {spread[0].max():7.1e}"
              f"  {json.dumps(dict(counts))}")


if __name__ == "__main__":
    main()
