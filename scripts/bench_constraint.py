"""What constrained decoding costs: mask time against a decode step, and compile time per schema.

    python scripts/bench_constraint.py [MODEL.gguf ...] [--steps 64] [--threads 2]

Per model (default: SmolLM2 and Gemma 3 from ~/.cache/modelyard), prints one JSON line:
- `adapter_s`: building the llguidance tokenizer adapter (once per model, cached);
- `compile_ms`: per schema of tests/gateway/test_tools_api.py's set, compiling it plus its first mask
  (what a request waits for, on a worker thread);
- with 8 sequences decoding of which 4 follow a schema (one BatchRunner step = one forward pass
  for all 8 + sampling): `step_ms` (median step), `mask_ms` / `mask_p99_ms` (median and p99 per
  step of the constraint work: the 4 masks computed together, applied to the logits, advanced by
  the sampled tokens), `mask_fraction` = mask_ms / step_ms (the target is < 0.10), and
  `step_ms_unconstrained` (the same batch with no constraint, in the same process, interleaved).
A model the engine cannot load yet reports the mask figures on its vocabulary with synthetic
logits, and no step figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CACHE = Path.home() / ".cache" / "modelyard"
DEFAULT_MODELS = [CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf", CACHE / "gemma-3-270m-q4_k_m.gguf"]
N_SEQ, N_CONSTRAINED = 8, 4


def long_schema(item: dict) -> dict:
    """A schema whose output stays open for many tokens: an array of `item`."""
    return {"type": "object", "properties": {"items": {"type": "array", "items": item,
                                                       "minItems": 40}},
            "required": ["items"], "additionalProperties": False}


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99))


def compile_times(adapter, schemas) -> list[float]:
    from engine.constraint import json_schema_grammar

    out = []
    for schema in schemas:
        t0 = time.perf_counter()
        adapter.compile(json_schema_grammar(schema))
        out.append(round((time.perf_counter() - t0) * 1e3, 2))
    return out


class Timed:
    """Wraps the runner's mask computation and the constraints' advance to time them."""

    def __init__(self) -> None:
        self.current = 0.0

    def wrap(self, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.current += time.perf_counter() - t0
        return timed


def apply_cost(n_vocab: int) -> float:
    """Seconds to apply one mask to one row of logits, as the sampler does."""
    x = np.random.default_rng(0).standard_normal(n_vocab).astype(np.float32)
    allowed = np.zeros(n_vocab, dtype=bool)
    allowed[::97] = True
    runs = []
    for _ in range(50):
        y = x.copy()
        t0 = time.perf_counter()
        np.copyto(y, np.float32(-np.inf), where=~allowed)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def bench_model(path: Path, steps: int, threads: int) -> dict:
    import engine
    from engine import batch
    from engine.constraint import Constraint, MaskFiller, TokenizerAdapter, json_schema_grammar
    from engine.gguf import GGUFFile
    from engine.tokenizer import Tokenizer
    from tests.support.schemas import SCHEMAS

    out: dict = {"model": path.name}
    try:
        model = engine.load(path, n_ctx=1024, n_threads=threads, n_slots=N_SEQ)
        tokenizer = model.tokenizer
    except Exception as exc:  # noqa: BLE001 - reported, the vocabulary is still measured
        model = None
        out["step"] = f"not measured: {exc}"
        f = GGUFFile(path)
        try:
            tokenizer = Tokenizer.from_metadata(f.metadata)
        finally:
            f.close()
    out["n_vocab"] = tokenizer.n_vocab
    t0 = time.perf_counter()
    adapter = TokenizerAdapter.of(tokenizer)
    out["adapter_s"] = round(time.perf_counter() - t0, 3)
    times = compile_times(adapter, SCHEMAS)
    out["compile_ms"] = times
    out["compile_ms_median"] = statistics.median(times)
    out["compile_ms_max"] = max(times)
    grammars = [json_schema_grammar(long_schema(SCHEMAS[i % len(SCHEMAS)]))
                for i in range(N_CONSTRAINED)]
    apply_s = apply_cost(tokenizer.n_vocab) * N_CONSTRAINED

    if model is None:  # masks along a fixed reply, no forward pass
        filler = MaskFiller(threads)
        cs: list[Constraint] = [adapter.compile(g) for g in grammars]
        text = json.dumps({"items": [{"name": "Ann", "age": 30}] * 40}, separators=(", ", ": "))
        ids = tokenizer.encode(text)
        per_step = []
        for t in ids[:steps]:
            t0 = time.perf_counter()
            filler.fill(cs)
            for c in cs:
                c.consume(t)
            per_step.append(time.perf_counter() - t0 + apply_s)
        out["mask_ms"] = round(statistics.median(per_step) * 1e3, 3)
        out["mask_p99_ms"] = round(p99(per_step) * 1e3, 3)
        return out

    prompt = tokenizer.encode("<|im_start|>user\nList people as JSON.<|im_end|>\n"
                              "<|im_start|>assistant\n", parse_special=True)

    def run(constrained: bool) -> tuple[list[float], list[float]]:
        runner = batch.BatchRunner(model)
        timer = Timed()
        runner._allowed = timer.wrap(runner._allowed)  # type: ignore[method-assign]
        seqs = []
        for i in range(N_SEQ):
            c = adapter.compile(grammars[i]) if constrained and i < N_CONSTRAINED else None
            if c is not None:
                c.consume = timer.wrap(c.consume)  # type: ignore[method-assign]
            seqs.append(batch.Sequence(prompt, params=engine.SamplingParams(temperature=0.7, seed=i),
                                       max_tokens=steps + 8, stop_at_eog=False, constraint=c))
            runner.submit(seqs[-1])
        while any(s.state is not batch.State.DECODING for s in seqs):  # prefill first
            runner.step()
        step_s, mask_s = [], []
        for _ in range(steps):
            if not all(s.state is batch.State.DECODING for s in seqs):
                break
            timer.current = 0.0
            t0 = time.perf_counter()
            runner.step()
            step_s.append(time.perf_counter() - t0)
            mask_s.append(timer.current + (apply_s if constrained else 0.0))
        for s in seqs:
            runner.end(s, "cancelled")
        runner.close()
        return step_s, mask_s

    with_c: list[float] = []
    without: list[float] = []
    masks: list[float] = []
    for _ in range(2):  # interleaved A/B: the machine's load drifts
        s, m = run(True)
        with_c += s
        masks += m
        without += run(False)[0]
    out["steps"] = len(with_c)
    out["step_ms"] = round(statistics.median(with_c) * 1e3, 2)
    out["step_ms_unconstrained"] = round(statistics.median(without) * 1e3, 2)
    out["mask_ms"] = round(statistics.median(masks) * 1e3, 3)
    out["mask_p99_ms"] = round(p99(masks) * 1e3, 3)
    out["mask_fraction"] = round(statistics.median(masks) / statistics.median(with_c), 4)
    model.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path, default=DEFAULT_MODELS)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for path in args.models:
        print(json.dumps(bench_model(path, args.steps, args.threads)), flush=True)


if __name__ == "__main__":
    main()
