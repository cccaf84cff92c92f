"""Run llama.cpp's own server tests against modelyard and classify what fails.

    python scripts/llama_server_tests.py --upstream /path/to/llama.cpp/tools/server/tests
    python scripts/llama_server_tests.py --upstream DIR unit/test_completion.py -k n_probs
    python scripts/llama_server_tests.py --classify full.json rerun.json   # past runs, merged

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
_STORIES_TEXT = "expects stories260K's text, token counts or BOS piece; SmolLM2 stands in"
_ONE_CARD_PER_ALIAS = ("/v1/models lists one object per alias (modelyard's documented listing); "
                       "the harness's catch-all `*` alias makes a second")
_FIRST_CHUNK = ("OpenAI's first stream chunk carries content \"\" (utils.py asserts a present "
                "content is non-empty or None)")
KNOWN: list[tuple[str, str, str]] = [
    # test_basic
    ("unit/test_basic.py::test_server_models", OPENAI, _ONE_CARD_PER_ALIAS),
    ("unit/test_basic.py::test_server_slots", OPENAI,
     "GET /slots is always served, read-only (llama-server: 501 without --slots)"),
    ("unit/test_basic.py::test_no_ui", NOT_SERVED, "llama.cpp's web UI (modelyard has its own console)"),
    # test_completion
    ("unit/test_completion.py::test_completion[[]*", TIED, _STORIES_TEXT),
    ("unit/test_completion.py::test_completion_stream[[]*", TIED, _STORIES_TEXT),
    ("unit/test_completion.py::test_completion_with_openai_library", OPENAI,
     "system_fingerprint is OpenAI's fp_..., not llama.cpp's build tag b<N> (then stories text)"),
    ("unit/test_completion.py::test_completion_stream_with_openai_library", TIED, _STORIES_TEXT),
    ("unit/test_completion.py::test_completion_response_fields*", TIED,
     "expects stories260K's BOS piece \"<s> \" in the echoed prompt"),
    ("unit/test_completion.py::test_nocache_long_input_prompt", TIED,
     "the prompt is over 256 tokens in stories260K's vocabulary, 224 in SmolLM2's"),
    ("unit/test_completion.py::test_completion_prompt_cache", TIED,
     "n_prompt = 5 tokens per \" Hello N\" + 2 is stories260K's tokenizer"),
    ("unit/test_completion.py::test_n_probs_post_backend_sampling", NOT_SERVED,
     "--backend_sampling (sampling on the GPU backend)"),
    # test_chat_completion
    ("unit/test_chat_completion.py::test_chat_completion[[]*", TIED, _STORIES_TEXT),
    ("unit/test_chat_completion.py::test_chat_completion_stream[[]*", OPENAI, _FIRST_CHUNK),
    ("unit/test_chat_completion.py::test_chat_completion_with_timings_per_token", OPENAI,
     _FIRST_CHUNK),
    ("unit/test_chat_completion.py::test_logprobs_stream", OPENAI, _FIRST_CHUNK),
    ("unit/test_chat_completion.py::test_chat_completion_with_openai_library", OPENAI,
     "system_fingerprint is OpenAI's fp_..., not llama.cpp's build tag b<N>"),
    ("unit/test_chat_completion.py::test_chat_completion_cached_tokens", OTHER,
     "prompt-cache reporting (the cache helper), counted in stories260K's tokens"),
    ("unit/test_chat_completion.py::test_chat_template*", NOT_SERVED,
     "the `__verbose` debug object of llama-server --verbose"),
    ("unit/test_chat_completion.py::test_verbose_debug", NOT_SERVED,
     "the `__verbose` debug object of llama-server --verbose"),
    ("unit/test_chat_completion.py::test_completion_with_response_format[[]response_format0*",
     TIED, _STORIES_TEXT),
    ("unit/test_chat_completion.py::test_completion_with_response_format[[]response_format2*",
     OPENAI, "json_schema without `name` is a 400, as OpenAI's"),
    ("unit/test_chat_completion.py::test_context_size_exceeded*", OPENAI,
     "context overflow is OpenAI's invalid_request_error/context_length_exceeded, not "
     "exceed_context_size_error"),
    ("unit/test_chat_completion.py::test_invalid_chat_completion_req[[]messages7[]]", OPENAI,
     "two assistant messages at the end are accepted, as OpenAI accepts them"),
    # test_compat_anthropic, test_compat_oai_responses
    ("unit/test_compat_anthropic.py::test_anthropic_empty_messages", OPENAI,
     "empty messages are a 400, as Anthropic's API answers"),
    ("unit/test_compat_anthropic.py::test_anthropic_tool_result_with_image", OPENAI,
     "an image for a model without vision is a 400 (a client error), not llama.cpp's 500"),
    ("unit/test_compat_anthropic.py::test_anthropic_vision_format_accepted", OPENAI,
     "an image for a model without vision is a 400 (a client error), not llama.cpp's 500"),
    ("unit/test_compat_oai_responses.py::test_responses_with_openai_library", TIED, _STORIES_TEXT),
    # test_ctx_shift
    ("unit/test_ctx_shift.py::test_ctx_shift_disabled_short_prompt[[]-1-*", OPENAI,
     "n_predict -1 is the default budget (min(1024, n_ctx/2)), not \"until the context is full\""),
    ("unit/test_ctx_shift.py::test_ctx_shift_disabled_long_prompt", TIED,
     "the prompt overflows 256 tokens in stories260K's vocabulary only"),
    # test_embedding
    ("unit/test_embedding.py::test_embedding_mixed_input[[]-False[]]", OPENAI,
     "an empty input is a 400, as OpenAI's"),
    ("unit/test_embedding.py::test_embedding_error_prompt_too_long", OPENAI,
     "overflow is OpenAI's context_length_exceeded message, not \"too large\""),
    ("unit/test_embedding.py::test_embedding_multiple_with_fa", TIED,
     "253-256-token inputs; the stand-in BERT has a 64-token context (bge-small: 512)"),
    ("unit/test_embedding.py::test_embedding_pooling_none", OPENAI,
     "/embeddings is OpenAI's path too: OpenAI's shape (llama.cpp's shape: /embedding)"),
    ("unit/test_embedding.py::test_embedding_usage_*", TIED,
     "bge-small's token counts; the stand-in BERT has another vocabulary"),
    # test_infill, test_metrics, test_proxy, test_kv_keep_only_active, test_sleep
    ("unit/test_infill.py::*", NOT_SERVED, "POST /infill (fill-in-the-middle)"),
    ("unit/test_metrics.py::*", NOT_SERVED,
     "llama.cpp's llamacpp:* metric names and --metrics switch (modelyard's /metrics has its own)"),
    ("unit/test_proxy.py::*", NOT_SERVED, "the web UI's CORS proxy"),
    ("unit/test_kv_keep_only_active.py::*", OTHER, "idle-slot cache offload (the cache helper)"),
    ("unit/test_sleep.py::test_server_sleep", OPENAI, _ONE_CARD_PER_ALIAS),
    ("unit/test_sleep.py::*", NOT_SERVED, "llama.cpp's llamacpp:* metric names"),
    # test_rerank
    ("unit/test_rerank.py::*", TIED,
     "jina-reranker's 8k context and token counts; the stand-in cross-encoder reads 96 tokens"),
    # test_router
    ("unit/test_router.py::*", NETWORK,
     "router presets and downloads from Hugging Face"),
    # test_security
    ("unit/test_security.py::test_access_static_assets_without_api_key", NOT_SERVED,
     "llama.cpp's web UI assets"),
    ("unit/test_security.py::test_correct_api_key*", OPENAI,
     "/completions is OpenAI's path too: OpenAI's shape, no `content`"),
    ("unit/test_security.py::test_cors_options*", OPENAI,
     "CORS is off unless `cors.allow_origins` names origins; then no credentials and the "
     "methods asked for (llama-server: any origin by default)"),
    ("unit/test_security.py::test_incorrect_api_key*", OPENAI,
     "a missing or wrong key is OpenAI's 401 invalid_request_error, not authentication_error"),
    # test_slot_save
    ("unit/test_slot_save.py::*", OTHER, "slot save/restore/erase (the cache helper)"),
    # test_template
    ("unit/test_template.py::test_reasoning*", "fail-API",
     "llama-server gives templates enable_thinking true unless --reasoning off (its edited "
     "templates close the block when it is undefined); modelyard sets it only when asked"),
    ("unit/test_template.py::test_date_inside_prompt[[]fireworks*", NOT_SERVED,
     "FireFunction v2's `functions` variable (llama.cpp's handler for that family)"),
    # test_tokenize
    ("unit/test_tokenize.py::test_tokenize_with_bos", TIED, "stories260K's BOS id 1"),
    # test_tool_call
    ("unit/test_tool_call.py::*STREAMED[]]", OPENAI, _FIRST_CHUNK),
    ("unit/test_tool_call.py::*", TIED, "the answers of llama.cpp's test models"),
    # test_vision_api
    ("unit/test_vision_api.py::*models_supports_multimodal_capability", OPENAI,
     "GET /models is OpenAI's list; llama.cpp's `models` array is not added"),
    ("unit/test_vision_api.py::*", NETWORK, "tinygemma3's mmproj and image URLs are on the internet"),
]


# the reports of return_progress count llama.cpp's batches of the prompt
KNOWN += [
    ("unit/test_chat_completion.py::test_return_progress[[]64-4-False[]]", TIED,
     "4 reports = a start and 3 batches of 64 of stories260K's tokens; SmolLM2's 70 would be "
     "2 batches in llama-server, 1 step of 128 prompt tokens here (--batch-size not mapped)"),
]


def classify(nodeid: str, outcome: str, text: str) -> tuple[str, str]:
    if outcome == "passed":
        return "pass", ""
    if outcome == "skipped":
        return "skipped", text.strip().splitlines()[-1][:120] if text.strip() else ""
    for category in (NETWORK, NOT_SERVED):
        marker = f"PluginRefusal: {category}: "
        if marker in text:
            return category, text.split(marker, 1)[1].splitlines()[0]
    if "gaierror" in text or "Name or service not known" in text:
        return NETWORK, "fetches a file from the internet"
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


def markdown(outcomes: dict[str, dict[str, str]]) -> str:
    """The counts and, per class, each test function (its parameter sets counted) with its
    reason: the table docs/api/llama-cpp.md keeps."""
    rows = [(nodeid, *classify(nodeid, o["outcome"], o["text"])) for nodeid, o in outcomes.items()]
    counts = Counter(category for _, category, _ in rows)
    lines = ["| class | tests |", "|---|---|"]
    lines += [f"| {c} | {counts.get(c, 0)} |" for c in CLASSES]
    lines += ["", "| class | test | n | why |", "|---|---|---|---|"]
    groups: Counter[tuple[str, str, str]] = Counter()
    for nodeid, category, reason in rows:
        if category != "pass":
            groups[(category, nodeid.split("[")[0].removeprefix("unit/"), reason)] += 1
    for (category, test, reason), n in sorted(groups.items(),
                                              key=lambda g: (CLASSES.index(g[0][0]), g[0][1])):
        reason = reason.replace("|", "\\|")
        lines.append(f"| {category} | `{test}` | {n} | {reason} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", type=Path,
                        help="llama.cpp's tools/server/tests folder (or llama.cpp's root)")
    parser.add_argument("--results", type=Path,
                        help="where to keep the outcomes as JSON (default: a temporary file)")
    parser.add_argument("--classify", type=Path, nargs="+",
                        help="classify past runs' JSON (a later file's outcomes replace an "
                             "earlier's: a partial rerun over a full run); run nothing")
    parser.add_argument("--markdown", action="store_true",
                        help="with --classify: the docs' table, one row per test function")
    args, pytest_args = parser.parse_known_args()
    if args.classify:
        merged: dict[str, dict[str, str]] = {}
        for path in args.classify:
            merged.update(json.loads(path.read_text()))
        print(markdown(merged) if args.markdown else report(merged))
        return
    if args.upstream is None:
        parser.error("--upstream DIR is required")
    results = args.results or Path(tempfile.mkdtemp()) / "results.json"
    run(tests_folder(args.upstream.resolve()), pytest_args, results.resolve())
    print(report(json.loads(results.read_text())))
    print(f"\noutcomes kept in {results}")


if __name__ == "__main__":
    main()
