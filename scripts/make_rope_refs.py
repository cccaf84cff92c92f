"""Make llama.cpp's logits under rope overrides (issue #31): tests/data/rope/rope_refs.npz.

    /opt/llama-venv/bin/python scripts/make_rope_refs.py [--out tests/data/rope/rope_refs.npz]

Runs llama-cpp-python (0.3.36, the llama.cpp it vendors; CPU, 2 threads, n_ctx 128, flash
attention off, as tests/data/synth was made) on two F32 files of tests/data/synth with the rope
context parameters of each case below, and keeps the logits of one batched decode of the file's
40 reference ids (every position). Each case stores `<case>_logits` float32 [40, n_vocab] and
`<case>_settings` (JSON: the file and every rope keyword passed to llama_cpp.Llama; the ones a
case does not set are llama-cpp-python's defaults, which the tests pass to the engine alike).
Needs only llama_cpp and numpy; run it with the venv's python, not modelyard's.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
SYNTH = HERE / "tests" / "data" / "synth"

# llama-cpp-python 0.3.36's defaults for the rope keywords (llama_cpp/llama.py): -1 scaling type
# is "the file's"; 0 base / scale are "the file's" too
DEFAULTS = {"rope_scaling_type": -1, "rope_freq_base": 0.0, "rope_freq_scale": 0.0,
            "yarn_ext_factor": -1.0, "yarn_attn_factor": 1.0, "yarn_beta_fast": 32.0,
            "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0}
QWEN2 = "qwen2_d64_gqa2_bias_f32"    # NEOX rope, base 1e6, no scaling keys (llama.cpp: linear)
GEMMA3 = "gemma3_d64_l6_swa8_f32"    # windowed layers with their own base (10000)
CASES: dict[str, tuple[str, dict[str, float | int]]] = {
    "qwen2_base": (QWEN2, {"rope_freq_base": 50000.0}),
    "qwen2_linear": (QWEN2, {"rope_freq_scale": 0.25}),
    "qwen2_none_ignores_scale": (QWEN2, {"rope_scaling_type": 0, "rope_freq_scale": 0.25}),
    "qwen2_yarn": (QWEN2, {"rope_scaling_type": 2, "rope_freq_scale": 0.25, "yarn_orig_ctx": 16}),
    "qwen2_yarn_custom": (QWEN2, {"rope_scaling_type": 2, "rope_freq_scale": 0.5,
                                  "yarn_ext_factor": 0.5, "yarn_beta_fast": 8.0,
                                  "yarn_beta_slow": 2.0, "yarn_orig_ctx": 12,
                                  "rope_freq_base": 20000.0}),
    "qwen2_attn_factor": (QWEN2, {"rope_scaling_type": 1, "rope_freq_scale": 0.5,
                                  "yarn_ext_factor": 0.0, "yarn_attn_factor": 0.8}),
    "gemma3_base": (GEMMA3, {"rope_freq_base": 100000.0}),
}


def logits(name: str, settings: dict[str, float | int], ids: list[int]) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(str(SYNTH / f"{name}.gguf"), n_ctx=128, n_batch=512, n_threads=2,
                          n_threads_batch=2, logits_all=True, flash_attn=False, verbose=False,
                          **settings)
    try:
        llm.eval(ids)  # one llama_decode: n_batch covers the prompt
        return np.array(llm.scores[:len(ids)], dtype=np.float32)  # [n_ids, n_vocab]
    finally:
        llm.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "tests" / "data" / "rope" / "rope_refs.npz")
    args = parser.parse_args()
    out: dict[str, np.ndarray] = {}
    for case, (name, overrides) in CASES.items():
        ids = np.load(SYNTH / f"{name}.npz")["ids"].tolist()
        settings = {**DEFAULTS, **overrides}
        out[f"{case}_logits"] = logits(name, settings, ids)
        out[f"{case}_settings"] = np.array(json.dumps({"file": f"{name}.gguf", **settings}))
        plain = np.load(SYNTH / f"{name}.npz")["logits"]
        print(f"{case}: max |logits - the file's own| = "
              f"{np.abs(out[f'{case}_logits'] - plain).max():.4f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
