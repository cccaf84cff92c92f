"""Time loading and reloading a config of many entries (issue #33 item 7: < 5 s for 10,000).

    python scripts/bench_config.py [--entries 10000] [--files 10000] [--rounds 3]
                                   [--vs-tree DIR]

Writes `--files` copies of the tests' tiny servable GGUF and a YAML config of `--entries`
entries over them (round robin), then, in a fresh process per round, times load_config twice:
the first load reads every header, the second (a reload of an unchanged config) should read
none. Imports are done (and timed apart) before either; CPU seconds are shown beside wall
seconds (steadier on a shared machine). `--vs-tree DIR` times another checkout (e.g. main before
a change) on the same files, interleaved round by round; medians. A script, not a timed test:
the figure depends on the machine and its load (run it under the bench lock when shared).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _time_loads(tree: Path, config: Path) -> dict[str, float]:
    """In this process, with `tree`'s gateway: seconds of the first load and of a reload (and
    of importing the config loader and the engine's header check, which the first load would
    otherwise include: a cost per process, not per entry)."""
    sys.path.insert(0, str(tree))
    start = time.perf_counter()
    import engine.servable  # noqa: F401
    from gateway.config import load_config

    out: dict[str, float] = {"import": time.perf_counter() - start}
    for label in ("load", "reload"):
        start, cpu = time.perf_counter(), time.process_time()
        loaded = load_config(config)
        out[label] = time.perf_counter() - start
        out[f"{label} cpu"] = time.process_time() - cpu  # steadier than wall on a busy machine
        out["entries"] = len(loaded.models)
    return out


def _write(root: Path, n_files: int, n_entries: int) -> Path:
    sys.path.insert(0, str(HERE))
    from tests.support.ggufgen import write_servable

    files = [write_servable(root / f"m{i}.gguf") for i in range(n_files)]
    lines = ["models:"]
    for i in range(n_entries):
        lines += [f"  - model: {files[i % len(files)].name}", f"    aliases: [e{i}]"]
    config = root / "config.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--vs-tree", type=Path, help="another checkout to time alike")
    parser.add_argument("--child", nargs=2, metavar=("TREE", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_time_loads(Path(args.child[0]), Path(args.child[1]))))
        return 0
    trees = {"ours": HERE} | ({"peer": args.vs_tree.resolve()} if args.vs_tree else {})
    with tempfile.TemporaryDirectory() as tmp:
        config = _write(Path(tmp), args.files, args.entries)
        taken: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for r in range(args.rounds):
            for name, tree in trees.items():
                done = subprocess.run([sys.executable, __file__, "--child", str(tree), str(config)],
                                      capture_output=True, text=True, check=True)
                t = json.loads(done.stdout.strip().splitlines()[-1])
                taken[name].append(t)
                print(f"round {r + 1} {name}: load {t['load']:.2f} s (cpu {t['load cpu']:.2f}), "
                      f"reload {t['reload']:.2f} s (cpu {t['reload cpu']:.2f}); "
                      f"{int(t['entries'])} entries over {args.files} files; imports "
                      f"{t['import']:.2f} s before", flush=True)
    keys = ("load", "load cpu", "reload", "reload cpu")
    medians = {name: {k: statistics.median(t[k] for t in ts) for k in keys}
               for name, ts in taken.items()}
    for name, m in medians.items():
        print(f"median {name}: " + ", ".join(f"{k} {m[k]:.2f} s" for k in keys))
    if "peer" in medians:
        print("ours/peer: " + ", ".join(f"{k} {medians['ours'][k] / medians['peer'][k]:.2f}"
                                        for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
