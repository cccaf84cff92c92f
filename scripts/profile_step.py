"""Where a batch step's time goes outside the kernels: N decoding sequences through BatchRunner.

    python scripts/profile_step.py MODEL.gguf [--sequences 8 32] [--steps 60] [--threads 2]
                                  [--logprobs] [--temperature 0]

For each N, N sequences (different prompts, SmolLM2's end tokens banned as bench_serve does, so
none ends) are read, then `--steps` decode steps are timed, each split into:

    kernels      the native pool's run (the forward pass's task graph)
    forward py   Transformer.forward around it: checks, tables, embedding rows, logits views
    sampling     BatchRunner._sample (greedy rows by engine/batch_greedy.py, others by Sampler)
    step py      the rest of BatchRunner.step: chunks, bookkeeping, taking the tokens

Medians per step, and the share that is not kernels. The server adds, per step, the scheduler's
detokenizing and stop scanning and the hand-off to the event loop (gateway/local/scheduler.py);
scripts/bench_serve.py measures the whole. On a shared machine compare shares, not times.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's engine


def profile(model_path: str, n: int, args: argparse.Namespace) -> dict[str, float]:
    import engine
    from engine.batch import BatchRunner, Sequence, State
    from engine.sampling import SamplingParams

    model = engine.load(model_path, n_ctx=1024, n_threads=args.threads, n_slots=n)
    runner = BatchRunner(model)
    spans: dict[str, list[float]] = defaultdict(list)

    def timed(obj: Any, name: str, key: str) -> None:
        real = getattr(obj, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                spans[key].append(time.perf_counter() - t)
        setattr(obj, name, wrapper)

    timed(runner.transformer, "forward", "forward")
    timed(runner.transformer.pool, "run", "kernels")
    timed(runner, "_sample", "sampling")
    params = SamplingParams(temperature=args.temperature, logprobs=args.logprobs, seed=1,
                            logit_bias={0: -100.0, 2: -100.0, 4: -100.0})
    for i in range(n):
        ids = model.tokenizer.encode(f"Write a long story about topic number {i}.")
        runner.submit(Sequence(ids, params=params, max_tokens=10**6, stop_at_eog=False))
    while not all(o is not None and o.state is State.DECODING for o in runner.slots):
        runner.step()
    for _ in range(5):  # every graph and thread count of this batch size tried once
        runner.step()
    for v in spans.values():
        v.clear()
    for _ in range(args.steps):
        t = time.perf_counter()
        runner.step()
        spans["step"].append(time.perf_counter() - t)
    runner.close()
    model.close()
    med = {k: statistics.median(v) for k, v in spans.items()}
    return {"kernels": med["kernels"], "forward py": med["forward"] - med["kernels"],
            "sampling": med["sampling"],
            "step py": med["step"] - med["forward"] - med["sampling"], "step": med["step"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--sequences", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--logprobs", action="store_true", help="ask each token's logprob")
    args = ap.parse_args()
    print(f"{'seqs':>5} {'step ms':>8} {'kernels':>8} {'fwd py':>7} {'sampling':>8} {'step py':>8} "
          f"{'not kernels':>11} {'tok/s':>7}")
    for n in args.sequences:
        r = profile(args.model, n, args)
        other = r["step"] - r["kernels"]
        print(f"{n:>5} {r['step'] * 1e3:>8.2f} {r['kernels'] * 1e3:>8.2f} "
              f"{r['forward py'] * 1e3:>7.2f} {r['sampling'] * 1e3:>8.2f} {r['step py'] * 1e3:>8.2f} "
              f"{100 * other / r['step']:>10.1f}% {n / r['step']:>7.0f}")


if __name__ == "__main__":
    main()
