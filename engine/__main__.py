"""python -m engine MODEL.gguf -p "prompt" -n 64: print a continuation and the speed."""
from __future__ import annotations

import argparse
import sys
import time

from . import ModelLoadError, SamplingParams, load


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    ap.add_argument("model", help="path to a GGUF file")
    ap.add_argument("-p", "--prompt", default="The capital of France is")
    ap.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=2048)
    ap.add_argument("--temp", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--special", action="store_true", help="parse special tokens in the prompt")
    ap.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-generation")
    args = ap.parse_args(argv)

    try:
        model = load(args.model, n_ctx=args.ctx_size, n_threads=args.threads)
    except (ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    with model:
        tok = model.tokenizer
        ids = tok.encode(args.prompt, add_special=True, parse_special=args.special)
        params = SamplingParams(temperature=args.temp, top_p=args.top_p, top_k=args.top_k,
                                seed=args.seed)
        decoder = tok.incremental_decoder()
        sys.stdout.write(args.prompt)
        t0 = time.perf_counter()
        t_first = None
        n = 0
        for s in model.stream(ids, params, args.n_predict, stop_at_eog=not args.ignore_eos):
            if t_first is None:
                t_first = time.perf_counter()
            sys.stdout.write(decoder.push(s.token))
            sys.stdout.flush()
            n += 1
        sys.stdout.write(decoder.flush() + "\n")
        t_end = time.perf_counter()
        prefill = (t_first or t_end) - t0
        decode = t_end - (t_first or t_end)
        print(f"\nload {model.load_seconds * 1000:.0f} ms | prefill {len(ids)} tokens "
              f"{len(ids) / max(prefill, 1e-9):.1f} tok/s | decode {max(n - 1, 0)} tokens "
              f"{max(n - 1, 0) / max(decode, 1e-9):.1f} tok/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
