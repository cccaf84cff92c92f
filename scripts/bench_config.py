"""Time loading and reloading a config of many entries (issue #33 item 7: < 5 s for 10,000).

    python scripts/bench_config.py [--entries 10000] [--files 10000]

Writes `--files` copies of the tests' tiny servable GGUF and a YAML config of `--entries`
entries over them (round robin), then times load_config twice: the first load reads every
header, the second (a reload of an unchanged config) should read none. A script, not a timed
test: the figure depends on the machine and its load.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable from a checkout

from gateway.config import load_config  # noqa: E402
from tests.support.ggufgen import write_servable  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = [write_servable(root / f"m{i}.gguf") for i in range(args.files)]
        lines = ["models:"]
        for i in range(args.entries):
            lines += [f"  - model: {files[i % len(files)].name}", f"    aliases: [e{i}]"]
        config = root / "config.yaml"
        config.write_text("\n".join(lines) + "\n")
        for label in ("load", "reload"):
            start = time.perf_counter()
            loaded = load_config(config)
            took = time.perf_counter() - start
            print(f"{label}: {len(loaded.models)} entries over {len(files)} files "
                  f"in {took:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
