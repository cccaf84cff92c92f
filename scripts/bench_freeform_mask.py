"""What a freeform (Responses custom) tool's input costs per token, in each of its two modes.

    python scripts/bench_freeform_mask.py [MODEL.gguf] [--lines 30]

Codex's apply_patch grammar (tests/data/codex) and a patch of `--lines` changed lines, fed token by
token through a constraint on the model's tokenizer (default: SmolLM2 from ~/.cache/modelyard),
timing each mask:
- `forced`: the tool named in tool_choice; the reply is the patch under the grammar as written;
- `auto`: offered beside a function under tool_choice auto; the reply is the generic family's
  {"tool_calls": [...]} with the patch inside a JSON string, under the grammar rewritten by
  engine/json_string_grammar.py (one lexeme per JSON character).
Prints one JSON line: tokens, median / mean / p99 mask ms per token, and compile ms, per mode.
Only masks are timed (no forward pass): compare them with a decode step of the model.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.constraint import TokenizerAdapter, lark_grammar, with_subgrammars  # noqa: E402
from engine.json_string_grammar import json_string_lark  # noqa: E402
from engine.tool_format_base import INPUT_GRAMMAR  # noqa: E402
from engine.tool_formats import GenericFormat  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path.home() / ".cache" / "modelyard" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SHELL = {"name": "shell", "parameters": {"type": "object", "properties": {
    "command": {"type": "array", "items": {"type": "string"}}}, "required": ["command"]}}
PATCH_TOOL = {"name": "apply_patch", "parameters": {"type": "object", "properties": {
    "input": {"type": "string"}}, "required": ["input"]}, INPUT_GRAMMAR: "input_0"}


def patch(lines: int) -> str:
    body = "".join(f'-    print("line {i}", x[{i}])\n+    log.info("line %d\\t%s", {i}, x[{i}])\n'
                   for i in range(lines))
    return f"*** Begin Patch\n*** Update File: src/app.py\n@@ def main():\n{body}*** End Patch\n"


def run(adapter: TokenizerAdapter, encode, grammar: str, text: str) -> dict[str, float]:
    start = time.perf_counter()
    constraint = adapter.compile(grammar)
    compile_ms = (time.perf_counter() - start) * 1e3
    times = []
    for token in encode(text):
        start = time.perf_counter()
        allowed = constraint.allowed()
        times.append((time.perf_counter() - start) * 1e3)
        assert allowed[token] and constraint.consume(token)
    assert constraint.accepting
    times.sort()
    return {"tokens": len(times), "median_ms": round(statistics.median(times), 3),
            "mean_ms": round(statistics.fmean(times), 3),
            "p99_ms": round(times[int(len(times) * 0.99)], 3), "compile_ms": round(compile_ms, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("--lines", type=int, default=30)
    args = parser.parse_args()
    tokenizer = engine.load(args.model).tokenizer
    adapter = TokenizerAdapter.of(tokenizer)
    grammar = (REPO / "tests" / "data" / "codex" / "apply_patch.lark").read_text()
    text = patch(args.lines)
    generic = GenericFormat()
    auto = with_subgrammars(lark_grammar(generic.grammar([SHELL, PATCH_TOOL], "auto", False)),
                            {"input_0": json_string_lark(grammar)})
    call = json.dumps({"tool_calls": [{"name": "apply_patch", "arguments": {"input": text}}]})
    print(json.dumps({"model": Path(args.model).name, "patch_chars": len(text),
                      "forced": run(adapter, tokenizer.encode, lark_grammar(grammar), text),
                      "auto": run(adapter, tokenizer.encode, auto, call)}))


if __name__ == "__main__":
    main()
