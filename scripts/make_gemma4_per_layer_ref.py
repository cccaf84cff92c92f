"""Make tests/data/synth3/gemma4_per_layer_logits.npz and gemma4_q8_projection_logits.npz:
llama.cpp's logits for two variants of the synth3 gemma4 files (tests/support/gemma4_files.py):
the F32 file with feed_forward_length and attention.head_count_kv as per-layer arrays (as
llama.cpp's converter writes them), and the Q8_0 file with per_layer_model_proj in Q8_0 too.
The tests rebuild the variants from the committed files, so only the logits and each variant's
sha256 are stored. Quantized files run with use_extra_bufts = False (the synth3 caveat).

Run with llama-cpp-python 0.3.36 (the synth3 settings: n_ctx 128, n_batch 512, flash attention
off, 2 threads):
    PYTHONPATH=. /opt/llama-venv/bin/python scripts/make_gemma4_per_layer_ref.py
"""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from llama_cpp import Llama

from tests.support.gemma4_files import write_per_layer_variant, write_quantized_projection_variant

ROOT = Path(__file__).resolve().parents[1]
SYNTH3 = ROOT / "tests/data/synth3"
BASE = "gemma4_d64_l6_ple_kvshare"
VARIANTS = (("gemma4_per_layer_logits.npz", f"{BASE}_f32", write_per_layer_variant, {}),
            ("gemma4_q8_projection_logits.npz", f"{BASE}_q8_0", write_quantized_projection_variant,
             {"use_extra_bufts": False}))


def main() -> None:
    for out, src, make, settings in VARIANTS:
        make_one(SYNTH3 / out, SYNTH3 / f"{src}.gguf", SYNTH3 / f"{src}.npz", make, settings)


def make_one(out: Path, src: Path, npz: Path, make: Any, settings: dict[str, Any]) -> None:
    ids = np.load(npz)["ids"].tolist()
    with tempfile.TemporaryDirectory() as tmp:
        path = make(src, Path(tmp) / "variant.gguf")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        llm = Llama(str(path), n_ctx=128, n_batch=512, n_threads=2, logits_all=True,
                    flash_attn=False, verbose=False, **settings)
        llm.eval(ids)
        batched = np.array(llm.scores[:len(ids)], np.float32)
        llm.reset()
        sequential = []
        for t in ids:
            llm.eval([t])
            sequential.append(np.array(llm.scores[llm.n_tokens - 1], np.float32))
        llm.close()
    np.savez_compressed(out, ids=np.array(ids, np.int32), logits=batched,
                        logits_sequential=np.stack(sequential), sha256=np.array(digest))
    gap = np.abs(batched - np.stack(sequential))
    print(f"wrote {out}; batched vs sequential max {gap.max():.2e} mean {gap.mean():.2e}")


if __name__ == "__main__":
    main()
