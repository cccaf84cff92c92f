"""Run llama.cpp's own server tests against modelyard and classify what fails.

    python scripts/llama_server_tests.py --upstream /path/to/llama.cpp/tools/server/tests
    python scripts/llama_server_tests.py --upstream DIR unit/test_completion.py -k n_probs
    python scripts/llama_server_tests.py --classify results.json   # a past run's outcomes again

The upstream files run unchanged under pytest with `scripts/llama_server_plugin.py`, which starts
`modelyard serve` (one local model standing in for the one each test downloads) where the tests
start `llama-server`. Every outcome lands in one class:

    pass                      the test passes against modelyard
    fail-API                  an expectation about the API that modelyard does not meet: a bug
    tied-to-llama.cpp-model   the expectation is the text, tokens or scores of llama.cpp's own
                              tiny test models (stories260K, bge-small, jina-reranker, ...)
    deliberately-OpenAI       modelyard answers as OpenAI's API does where llama.cpp differs
    needs-network             the test downloads a model, adapter or file from the internet
    feature-not-served        a llama-server feature modelyard does not have
    other-helper              slot save/restore and prompt-cache reporting, speculative/LoRA per
                              request: another issue's work
    skipped                   the upstream test skips itself (slow tests, a platform)

Classes other than pass and fail-API come from the plugin's refusals (a model only Hugging Face
has, an unserved flag) or from KNOWN below, one reason per test. Not part of the CI test command:
CI has no llama.cpp source. docs/api/llama-cpp.md keeps the last run's list.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent

TIED = "tied-to-llama.cpp-model"
OPENAI = "deliberately-OpenAI"
NETWORK = "needs-network"
NOT_SERVED = "feature-not-served"
OTHER = "other-helper"
CLASSES = ("pass", "fail-API", TIED, OPENAI, NETWORK, NOT_SERVED, OTHER, "skipped")

# nodeid glob -> (class, reason); first match wins. Only failing tests are looked up.
KNOWN: list[tuple[str, str, str]] = []


def classify(nodeid: str, outcome: str, text: str) -> tuple[str, str]:
    if outcome == "passed":
        return "pass", ""
    if outcome == "skipped":
        return "skipped", text.strip().splitlines()[-1][:120] if text.strip() else ""
    for category in (NETWORK, NOT_SERVED):
        marker = f"PluginRefusal: {category}: "
        if marker in text:
            return category, text.split(marker, 1)[1].splitlines()[0]
    for pattern, category, reason in KNOWN:
        if fnmatch.fnmatchcase(nodeid, pattern):
            return category, reason
    lines = [line for line in text.splitlines() if line.startswith("E ")]
    return "fail-API", (lines[0][1:].strip() if lines else "")[:160]


def tests_folder(upstream: Path) -> Path:
    for candidate in (upstream, upstream / "tools" / "server" / "tests"):
        if (candidate / "utils.py").is_file() and (candidate / "unit").is_dir():
            return candidate
    raise SystemExit(f"{upstream}: neither it nor tools/server/tests holds utils.py and unit/")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(folder: Path, pytest_args: list[str], results: Path) -> int:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(folder), os.environ.get("PYTHONPATH", "")]),
        "PORT": str(free_port()),
        "MODELYARD_UPSTREAM_RESULTS": str(results),
    }
    argv = [sys.executable, "-m", "pytest", "-p", "llama_server_plugin", "-p", "no:cacheprovider",
            "-q", "--tb=short", *(pytest_args or ["unit"])]
    return subprocess.call(argv, cwd=folder, env=env)


def report(outcomes: dict[str, dict[str, str]]) -> str:
    rows = sorted((nodeid, *classify(nodeid, o["outcome"], o["text"]))
                  for nodeid, o in outcomes.items())
    counts = Counter(category for _, category, _ in rows)
    lines = [f"{len(rows)} tests", ""]
    lines += [f"{category:26} {counts.get(category, 0):4}" for category in CLASSES]
    lines.append("")
    for category in CLASSES[1:]:
        for nodeid, cat, reason in rows:
            if cat == category:
                lines.append(f"{cat:26} {nodeid}  -- {reason}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", type=Path,
                        help="llama.cpp's tools/server/tests folder (or llama.cpp's root)")
    parser.add_argument("--results", type=Path,
                        help="where to keep the outcomes as JSON (default: a temporary file)")
    parser.add_argument("--classify", type=Path, help="classify a past run's JSON; run nothing")
    args, pytest_args = parser.parse_known_args()
    if args.classify:
        print(report(json.loads(args.classify.read_text())))
        return
    if args.upstream is None:
        parser.error("--upstream DIR is required")
    results = args.results or Path(tempfile.mkdtemp()) / "results.json"
    run(tests_folder(args.upstream.resolve()), pytest_args, results.resolve())
    print(report(json.loads(results.read_text())))
    print(f"\noutcomes kept in {results}")


if __name__ == "__main__":
    main()
