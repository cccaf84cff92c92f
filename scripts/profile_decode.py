"""Where a decode step's time goes: per task kind, and per matmul with its GB/s.

    python scripts/profile_decode.py MODEL.gguf [--threads 2] [--steps 48] [--batch 1]
                                   [--prefill N [--depth D]]

Runs `--steps` decode steps of `--batch` sequences (with --prefill N: `--steps` prefills of
one N-token prompt in a fresh context instead; with --depth D too, of an N-token chunk after D
cached tokens, as the last chunks of a long prompt run) through the fused graph twice, interleaved:
whole (one pool dispatch per step, as the engine runs it) and node by node (each node its own
dispatch, timed alone). The node-by-node sum less the whole step's time is what the per-node
dispatches add; the rest is each task's own time. Decode matmuls print bytes read and GB/s.
Numbers are medians over the steps; on a shared machine compare runs interleaved, not figures.
A mixture's expert matmuls (moe_matmul) count the bytes of the experts a step can choose
(n_expert_used of n_expert per token, at most all of them).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from typing import Any

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--top", type=int, default=12, help="matmuls to list by time")
    ap.add_argument("--prefill", type=int, default=0, metavar="N",
                    help="profile prefills of an N-token prompt instead of decode steps")
    ap.add_argument("--depth", type=int, default=0, metavar="D",
                    help="with --prefill: the chunk comes after D cached tokens")
    args = ap.parse_args()

    import engine
    from engine.formats import quants
    from engine.kernels import moe_oai, moe_tasks, tasks
    from engine.kv import MAX_CHUNK
    from engine.model import Chunk

    n_ctx = max(1024, args.depth + args.prefill + 16)
    model = engine.load(args.model, n_ctx=n_ctx, n_threads=args.threads, n_slots=args.batch)
    tr = model.transformer
    text = "The quick brown fox jumps over the lazy dog. "
    ids = model.tokenizer.encode(text * max(8, (args.depth + args.prefill) // 8))
    for s in range(args.batch):
        tr.forward([Chunk(s, ids[s:s + 32], 0)], "last")
    names = {addr: name for name, addr in tr.tasks.address.items()}
    names.update({addr: name for name, addr in moe_tasks.task_addresses().items()})
    names.update({addr: name for name, addr in moe_oai.load_moe_oai().address.items()})
    mat_names: dict[int, str] = {}
    mat_bytes = {m.address: m.nbytes for m in tr.weights.matrices()}
    for layer in tr.weights.layers:
        for n, m in vars(layer).items():
            if isinstance(m, quants.StackedMatrix):  # a mixture's experts: bytes of the chosen
                mat_names[m.address] = n
                share = tr.hp.dim("n_expert_used") / tr.hp.dim("n_expert")
                mat_bytes[m.address] = int(m.n_mat * m.matrix_bytes * min(1.0, share * args.batch))
            elif hasattr(m, "address") and hasattr(m, "n_rows"):
                mat_names[m.address] = n
    mat_names[tr.weights.output.address] = "output"
    for a in range(0, args.depth, MAX_CHUNK):  # the cached tokens a --depth chunk comes after
        tr.forward([Chunk(0, ids[a:min(a + MAX_CHUNK, args.depth)], a)], "last")
    pool = tr.pool
    real_run = pool.run
    per_node: dict[int, list[float]] = defaultdict(list)
    whole: list[float] = []
    mode = {"split": False}

    def run(graph: Any, step: int = 0, threads: int | None = None) -> None:
        nodes = graph.nodes if hasattr(graph, "nodes") else graph
        if not mode["split"]:
            t = time.perf_counter()
            real_run(nodes, step, threads)
            whole.append(time.perf_counter() - t)
            return
        for i in range(nodes.shape[0]):
            t = time.perf_counter()
            real_run(nodes[i:i + 1], step, threads)
            per_node[i].append(time.perf_counter() - t)

    pool.run = run  # type: ignore[method-assign]
    tr.governor.choose = lambda kind: args.threads  # type: ignore[method-assign]
    toks = [ids[32 + s] for s in range(args.batch)]
    pos = 32
    for i in range(args.steps * 2):
        mode["split"] = bool(i % 2)
        if args.prefill:  # position `depth` again: the slot truncated back there
            tr.forward([Chunk(0, ids[args.depth:args.depth + args.prefill], args.depth)], "last")
            continue
        logits = tr.forward([Chunk(s, [toks[s]], pos) for s in range(args.batch)], "last")
        toks = [int(np.argmax(row)) for row in logits]
        pos += 1
    pool.run = real_run  # type: ignore[method-assign]

    graph = tr._graphs["last"][0]
    nodes = graph.nodes
    by_kind: dict[str, float] = defaultdict(float)
    mats: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    node_total = 0.0
    for i, task in enumerate(nodes[:, 0]):
        t = statistics.median(per_node[i])
        node_total += t
        name = names[int(task)].removeprefix("task_")
        if name in ("matmul", "moe_matmul"):
            layout = tasks.MATMUL if name == "matmul" else moe_tasks.EXPERT_MATMUL
            w = int(graph._keep[i][layout.offset("w") // 8])
            label = mat_names.get(w, "?")
            mats[label][0] += t
            mats[label][1] += mat_bytes.get(w, 0)
            name = "matmul " + label
        by_kind[name] += t
    step = statistics.median(whole)
    shape = f"prefill {args.prefill} at depth {args.depth}" if args.prefill else f"batch {args.batch}"
    print(f"{model.path.name if hasattr(model, 'path') else args.model}: {args.threads} threads, "
          f"{shape}, {nodes.shape[0]} nodes")
    per_step = args.prefill or args.batch  # tokens a step evaluates
    print(f"whole step {step * 1e3:.3f} ms ({per_step / step:.1f} tok/s); node by node "
          f"{node_total * 1e3:.3f} ms (+{(node_total - step) * 1e6 / nodes.shape[0]:.2f} us/node)")
    for name, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        extra = ""
        if name.startswith("matmul ") and not args.prefill:  # (a prefill is compute-bound)
            nbytes = mats[name.removeprefix("matmul ")][1]
            extra = f"  {nbytes / 1e6:8.2f} MB  {nbytes / t / 1e9:6.2f} GB/s"
        print(f"  {name:20s} {t * 1e3:8.3f} ms  {100 * t / node_total:5.1f}%{extra}")
    model.close()


if __name__ == "__main__":
    main()
