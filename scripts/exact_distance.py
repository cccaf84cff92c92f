"""Distance of modelyard's and llama.cpp's logits to an exact evaluation, per real model.

    python scripts/exact_distance.py [--models smollm2,gemma3] [--layouts default,none]

The accuracy rule for a kernel whose rounding differs from llama.cpp's (issue #36): its logits
must be as close to the float64 evaluation of the same dequantized weights
(tests/support/reference_model.py) as llama.cpp's are, on the prompts of llama.cpp's stored
references (tests/data/smollm2, tests/data/gemma3). tests/support/exact_distance.py defines the
distance (mean |logit - exact| at llama.cpp's top-32 ids of every row; `last`: the last row's
whole vocabulary); tests/engine/test_exact_distance.py asserts the rule.

`--layouts` runs our engine once per MODELYARD_INTERLEAVED setting, each in a process of its
own (the variable is read at import): `default` is the engine as shipped, `none` every matrix
on the file-layout kernels, anything else a type list (e.g. Q8_0,Q4_0,Q4_1).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.exact_distance import measure, pooled, prompt_names  # noqa: E402
from tests.support.reference_model import ReferenceModel  # noqa: E402
from tests.support.refs import GEMMA3_DIR, REFS_DIR  # noqa: E402

CACHE = Path.home() / ".cache" / "modelyard"
MODELS = {"smollm2": (CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf", REFS_DIR),
          "gemma3": (CACHE / "gemma-3-270m-q4_k_m.gguf", GEMMA3_DIR)}

# A child evaluates every reference prompt with our engine and saves the logits.
OURS = r'''
import sys
import numpy as np
import engine
path, refs, out = sys.argv[1], sys.argv[2], sys.argv[3]
model = engine.load(path, n_ctx=2048, n_threads=2)
saved = {}
with np.load(refs + "/logits_top32.npz") as ref:
    for name in sys.argv[4:]:
        saved[name] = model.logits(ref[name + "_ids"].tolist())
model.close()
np.savez(out, **saved)
'''


def our_logits(path: Path, refs: Path, names: list[str], layout: str) -> dict[str, np.ndarray]:
    env = dict(os.environ)
    if layout != "default":
        env["MODELYARD_INTERLEAVED"] = layout
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.npz"
        subprocess.run([sys.executable, "-c", OURS, str(path), str(refs), str(out), *names],
                       cwd=REPO, env=env, check=True)
        with np.load(out) as saved:
            return {n: saved[n] for n in names}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layouts", default="default", help="MODELYARD_INTERLEAVED settings, ';'-separated")
    args = ap.parse_args()
    print(f"{'model':8s} {'prompt':10s} {'tokens':>6s} {'engine':22s} {'top-32':>8s} {'last row':>9s}")
    for key in args.models.split(","):
        path, refs = MODELS[key]
        names = prompt_names(refs)
        runs = {layout: our_logits(path, refs, names, layout) for layout in args.layouts.split(";")}
        exact = ReferenceModel(str(path))
        for layout, logits in runs.items():
            rows = measure(exact, refs, lambda ids, lg=logits, rf=refs: lg[_name(rf, ids)])
            for r in rows:
                print(f"{key:8s} {r.name:10s} {r.n_tokens:6d} {'modelyard ' + layout:22s} "
                      f"{r.ours.top32:8.4f} {r.ours.last:9.4f}")
            ours, llama = pooled(rows)
            print(f"{key:8s} {'all':10s} {'':6s} {'modelyard ' + layout:22s} {ours.top32:8.4f} "
                  f"{ours.last:9.4f}   ratio to llama.cpp {ours.top32 / llama.top32:.3f}")
        for r in rows:
            print(f"{key:8s} {r.name:10s} {r.n_tokens:6d} {'llama.cpp':22s} "
                  f"{r.llama.top32:8.4f} {r.llama.last:9.4f}")
        print(f"{key:8s} {'all':10s} {'':6s} {'llama.cpp':22s} {llama.top32:8.4f} {llama.last:9.4f}")
        del exact


def _name(refs: Path, ids: list[int]) -> str:
    """The reference prompt whose ids these are (measure passes ids, the children saved names)."""
    with np.load(refs / "logits_top32.npz") as ref:
        return next(n for n in prompt_names(refs) if ref[f"{n}_ids"].tolist() == ids)


if __name__ == "__main__":
    main()
