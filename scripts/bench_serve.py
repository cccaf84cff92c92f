"""Serving throughput under concurrency: N streaming chat clients against a running server.

    python scripts/bench_serve.py http://127.0.0.1:8080 [--model smollm2]
        [--peer http://127.0.0.1:8000 --peer-model NAME] [--levels 1 2 4 8 16]

For each level N, N client threads (each its own openai client) send `--requests` streaming chat
completions one after another (different prompts, `--max-tokens` tokens each; SmolLM2's end
tokens are banned by default so every answer has the full length). Printed per level:

    total tok/s     generated tokens of all clients / wall time of the level
    stream tok/s    per request: tokens after the first / time from first to last token (mean)
    TTFT p50/95/99  time from sending to the first content token

With level 1 and 8 (and 32) run, the ratios issue #35 sets bars on are printed: 8 clients over
1 client, 8 clients over the peer's 8, 32 over 8, and TTFT p99 at 8 over TTFT p99 at 1. Run the
levels above the server's slot count (n_parallel / -np) to load its admission queue.

With --peer (llama.cpp's llama-server with `-np 8`, which batches; or llama-cpp-python's server,
started with `--interrupt_requests False` or it cuts a running stream short for each new
request) the same load is run against it, interleaved: for each of `--rounds` rounds, each level
runs on modelyard and then on the peer, and the medians over the rounds are printed with their
ratio. A stream that ends without a finish_reason counts as an error. Ends with one JSON line of
every figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import openai

TOPICS = ["a lighthouse keeper", "a lost robot", "the first snow", "a city under the sea",
          "a dragon who bakes", "an old violin", "a journey by train", "a garden on Mars",
          "a talking cat", "the last library", "a storm at sea", "a clockmaker's apprentice",
          "a desert caravan", "a forgotten island", "a winter festival", "a river that sings"]
SMOLLM2_EOG = ["0", "2", "4"]


@dataclass
class Sample:
    sent: float
    first: float | None
    done: float
    tokens: int


def one_stream(client: openai.OpenAI, model: str, prompt: str, args: argparse.Namespace) -> Sample:
    extra: dict[str, Any] = {}
    if args.ban:
        extra["logit_bias"] = dict.fromkeys(args.ban, -100)
    sent = time.perf_counter()
    first = None
    tokens = 0
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
        temperature=args.temperature, stream=True, **extra)
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                tokens += 1  # both servers send one chunk per generated token
                if first is None:
                    first = time.perf_counter()
            finish = choice.finish_reason or finish
    if finish is None:  # e.g. llama-cpp-python interrupting a stream for a newer request
        raise RuntimeError(f"stream ended without a finish_reason after {tokens} tokens")
    return Sample(sent, first, time.perf_counter(), tokens)


def run_level(url: str, model: str, n_clients: int, args: argparse.Namespace) -> dict[str, Any]:
    samples: list[Sample] = []
    errors: list[str] = []
    lock = threading.Lock()

    clients = [_client(url) for _ in range(n_clients)]  # made before the clock starts

    def client_loop(number: int) -> None:
        client = clients[number]
        for r in range(args.requests):
            topic = TOPICS[(number * args.requests + r) % len(TOPICS)]
            prompt = f"Write a long story about {topic}. (client {number}, request {r})"
            try:
                sample = one_stream(client, model, prompt, args)
            except (openai.OpenAIError, RuntimeError) as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                samples.append(sample)

    started = time.perf_counter()
    with ThreadPoolExecutor(n_clients) as pool:  # every client at once
        list(pool.map(client_loop, range(n_clients)))
    wall = time.perf_counter() - started
    total = sum(s.tokens for s in samples)
    ttft = sorted(s.first - s.sent for s in samples if s.first is not None)
    rates = [(s.tokens - 1) / (s.done - s.first) for s in samples
             if s.first is not None and s.tokens > 1 and s.done > s.first]
    return {
        "clients": n_clients,
        "requests": len(samples),
        "errors": len(errors),
        "tokens": total,
        "total_tok_s": round(total / wall, 1),
        "stream_tok_s": round(statistics.mean(rates), 1) if rates else None,
        "ttft_p50_s": round(_percentile(ttft, 0.50), 3) if ttft else None,
        "ttft_p95_s": round(_percentile(ttft, 0.95), 3) if ttft else None,
        "ttft_p99_s": round(_percentile(ttft, 0.99), 3) if ttft else None,
        "first_error": errors[0] if errors else None,
    }


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0,
                         timeout=600)


def bench(name: str, url: str, model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    print(f"\n{name}: {url} model={model}", file=sys.stderr)
    # warm up: load the model and compile, then one short round at the highest concurrency so
    # every batch size has run once (first runs of a size build its step graph and try thread
    # counts) before anything is timed
    warm = argparse.Namespace(**{**vars(args), "max_tokens": 8, "requests": 1})
    one_stream(_client(url), model, "Hello!", warm)
    run_level(url, model, max(args.levels), warm)
    print(f"{'clients':>7} {'total tok/s':>11} {'stream tok/s':>12} {'TTFT p50':>9} "
          f"{'TTFT p95':>9} {'TTFT p99':>9} {'errors':>6}", file=sys.stderr)
    rows = []
    for n in args.levels:
        row = run_level(url, model, n, args)
        rows.append(row)
        print(f"{n:>7} {row['total_tok_s']:>11} {row['stream_tok_s']!s:>12} "
              f"{row['ttft_p50_s']!s:>9} {row['ttft_p95_s']!s:>9} {row['ttft_p99_s']!s:>9} "
              f"{row['errors']:>6}",
              file=sys.stderr)
        if row["first_error"]:
            print(f"        first error: {row['first_error']}", file=sys.stderr)
    for line in bar_ratios(rows, None):
        print(line, file=sys.stderr)
    return rows


def bar_ratios(ours: list[dict[str, Any]], peer: list[dict[str, Any]] | None) -> list[str]:
    """The ratios issue #35's bars name, for the levels that were run."""
    tok = {r["clients"]: r["total_tok_s"] for r in ours}
    p99 = {r["clients"]: r["ttft_p99_s"] for r in ours}
    theirs = {r["clients"]: r["total_tok_s"] for r in peer or []}
    lines = []
    if tok.get(1) and 8 in tok:
        lines.append(f"8 clients / 1 client: {tok[8] / tok[1]:.2f}x (bar >= 5x)")
    if theirs.get(8) and 8 in tok:
        lines.append(f"8 clients / peer's 8 clients: {tok[8] / theirs[8]:.2f}x (bar >= 4x)")
    if tok.get(8) and 32 in tok:
        lines.append(f"32 clients / 8 clients: {tok[32] / tok[8]:.2f}x (bar >= 1x)")
    if p99.get(1) and p99.get(8) is not None:
        lines.append(f"TTFT p99 8 clients / 1 client: {p99[8] / p99[1]:.2f}x (bar <= 3x)")
    return lines


def _warm(url: str, model: str, args: argparse.Namespace) -> None:
    warm = argparse.Namespace(**{**vars(args), "max_tokens": 8, "requests": 1})
    one_stream(_client(url), model, "Hello!", warm)
    run_level(url, model, max(args.levels), warm)


def interleaved(args: argparse.Namespace) -> dict[str, Any]:
    """Every level on both servers, `args.rounds` times, alternating; medians per level."""
    servers = {"modelyard": (args.url, args.model),
               "peer": (args.peer, args.peer_model or args.model)}
    for url, model in servers.values():
        _warm(url, model, args)
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {n: {c: [] for c in args.levels}
                                                         for n in servers}
    for r in range(args.rounds):
        for n in args.levels:
            for name, (url, model) in servers.items():
                row = run_level(url, model, n, args)
                runs[name][n].append(row)
                print(f"round {r + 1} {name:>9} {n:>3} clients: {row['total_tok_s']:>7} tok/s "
                      f"(errors {row['errors']})", file=sys.stderr)
    medians: dict[str, list[dict[str, Any]]] = {}
    for name in servers:
        medians[name] = [{
            "clients": n,
            "total_tok_s": statistics.median(x["total_tok_s"] for x in rows),
            "ttft_p50_s": statistics.median(x["ttft_p50_s"] or 0 for x in rows),
            "ttft_p99_s": statistics.median(x["ttft_p99_s"] or 0 for x in rows),
            "errors": sum(x["errors"] for x in rows),
            "rounds": [x["total_tok_s"] for x in rows]} for n, rows in runs[name].items()]
    print(f"\nmedians of {args.rounds} rounds, total tok/s "
          f"({args.max_tokens} tokens per streamed chat request)", file=sys.stderr)
    print(f"{'clients':>7} {'modelyard':>10} {'peer':>10} {'ratio':>6}  TTFT p50 / p99 ms "
          "(modelyard; peer)", file=sys.stderr)
    for ours, theirs in zip(medians["modelyard"], medians["peer"]):
        ratio = ours["total_tok_s"] / theirs["total_tok_s"] if theirs["total_tok_s"] else 0
        print(f"{ours['clients']:>7} {ours['total_tok_s']:>10.1f} {theirs['total_tok_s']:>10.1f} "
              f"{ratio:>6.2f}  {ours['ttft_p50_s'] * 1e3:.0f} / {ours['ttft_p99_s'] * 1e3:.0f}; "
              f"{theirs['ttft_p50_s'] * 1e3:.0f} / {theirs['ttft_p99_s'] * 1e3:.0f}",
              file=sys.stderr)
    for line in bar_ratios(medians["modelyard"], medians["peer"]):
        print(line, file=sys.stderr)
    return {"max_tokens": args.max_tokens, "temperature": args.temperature,
            "requests_per_client": args.requests, "rounds": args.rounds, **medians}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("url", help="modelyard's base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--peer", help="another OpenAI-compatible server to run the same load against")
    ap.add_argument("--peer-model", help="model name on the peer (default: --model)")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--requests", type=int, default=2, help="requests per client per level")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ban", nargs="*", default=SMOLLM2_EOG,
                    help="token ids to ban (logit_bias -100); default SmolLM2's end tokens")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --peer: rounds of every level on both servers, interleaved")
    args = ap.parse_args()
    if args.peer:
        print(json.dumps(interleaved(args)))
        return
    result: dict[str, Any] = {"max_tokens": args.max_tokens, "temperature": args.temperature,
                              "requests_per_client": args.requests,
                              "modelyard": bench("modelyard", args.url, args.model, args)}
    if args.peer:
        result["peer"] = bench("peer", args.peer, args.peer_model or args.model, args)
        ours = {r["clients"]: r["total_tok_s"] for r in result["modelyard"]}
        theirs = {r["clients"]: r["total_tok_s"] for r in result["peer"]}
        if 8 in ours and theirs.get(8):
            print(f"modelyard / peer at 8 clients: {ours[8] / theirs[8]:.2f}x", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
