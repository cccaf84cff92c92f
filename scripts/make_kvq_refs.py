"""Make tests/data/kvq/: llama.cpp's logits with an f16, q8_0 and q4_0 KV cache (issue #30).

Run with llama-cpp-python 0.3.36's interpreter (never a modelyard dependency):

    /opt/llama-venv/bin/python scripts/make_kvq_refs.py \\
        --smollm2 ~/.cache/modelyard/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/data/kvq

Per model and prompt (a few hundred tokens, evaluated as one batch with flash attention on, as
llama.cpp requires for a quantized V cache), it stores the prompt's ids, the f16 cache's top-32
token ids at every position, and each KV type's logits at those ids (float32 [n_pos, 32]): what
a test needs to measure llama.cpp's own q8_0-vs-f16 spread and ours against its q8_0, small.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

GGML = {"f16": 1, "q8_0": 8, "q4_0": 2}   # ggml type numbers, llama-cpp-python's type_k/type_v
HERE = Path(__file__).resolve().parents[1]
SYNTH = HERE / "tests/data/synth/qwen3_d64_hd32_qknorm_f32.gguf"   # head_dim 32: one block


def logits(path: Path, ids: list[int], kv: str, n_ctx: int) -> np.ndarray:
    from llama_cpp import Llama  # noqa: PLC0415 - only in the peer's venv

    llm = Llama(str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=2, logits_all=True,
                flash_attn=True, type_k=GGML[kv], type_v=GGML[kv], verbose=False, seed=0)
    llm.eval(ids)
    out = np.array(llm.scores[:len(ids)], np.float32)
    llm.close()
    return out


def prompts(path: Path, smollm2: bool) -> dict[str, list[int]]:
    if smollm2:
        from llama_cpp import Llama  # noqa: PLC0415

        text = str(np.load(HERE / "tests/data/smollm2/logits_top32.npz")["paragraph_text"])
        tok = Llama(str(path), n_ctx=64, vocab_only=True, verbose=False)
        story = tok.tokenize(text.encode(), add_bos=False)
        return {"story": (story + story)[:320]}          # the story, then its start again
    return {"random": np.random.default_rng(30).integers(1, 496, 400).tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=HERE / "tests/data/kvq")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for name, path, is_smol in (("smollm2", a.smollm2, True), ("synth_qwen3", SYNTH, False)):
        arrays: dict[str, np.ndarray] = {}
        for pname, ids in prompts(path, is_smol).items():
            full = {kv: logits(path, ids, kv, 512) for kv in GGML}
            top = np.argsort(-full["f16"], axis=1)[:, :32].astype(np.int32)        # [n_pos, 32]
            arrays[f"{pname}_ids"] = np.array(ids, np.int32)
            arrays[f"{pname}_top_ids"] = top
            for kv, lg in full.items():
                arrays[f"{pname}_{kv}"] = np.take_along_axis(lg, top, axis=1)
            spread = np.abs(arrays[f"{pname}_q8_0"] - arrays[f"{pname}_f16"]).max()
            print(f"{name} {pname}: {len(ids)} tokens, llama.cpp q8_0 vs f16 max |dlogit| {spread:.4f}")
        np.savez_compressed(a.out / f"{name}.npz", **arrays)


if __name__ == "__main__":
    main()
