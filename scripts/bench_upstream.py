"""What a front instance adds: a request through an upstream entry vs the same request direct.

    python scripts/bench_upstream.py [--model FILE.gguf] [--requests 200] [--streams 10]
        [--max-tokens 256] [--backend model|echo|both]

Starts `modelyard serve` processes on loopback ports: a backend serving `--model` (default: the
cached SmolLM2) and a front whose config routes the alias `far` to it (`upstream:`), plus, for
`echo`, a minimal OpenAI-shaped server that answers at once (so the gateway's own cost is not
hidden under the model's). Then, interleaved (direct, front, direct, front, ... one client, one
kept-alive connection each):

    latency    `--requests` non-streaming chat requests of 1 token: p50 / p99 of each path,
               and of the per-pair difference (front - direct): the added latency per request
    streaming  `--streams` streams of `--max-tokens` tokens: chunks per second after the first,
               median of each path; the overhead is 1 - front / direct

The figures are wall clock: run it on a quiet machine. Ends with one JSON line of every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_EOG = {"0": -100, "2": -100, "4": -100}  # SmolLM2's end tokens: every answer runs full
ECHO_SERVER = r'''
import json, sys
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
import hypercorn.asyncio, hypercorn.config, asyncio

async def models(request):
    return JSONResponse({"object": "list", "data": [{"id": "echo", "object": "model"}]})

async def chat(request):
    body = await request.json()
    n = int(body.get("max_tokens") or 1)
    if not body.get("stream"):
        return JSONResponse({"id": "x", "object": "chat.completion", "model": "echo", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "a" * n},
             "finish_reason": "length"}]})
    async def events():
        for _ in range(n):
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": "echo",
                     "choices": [{"index": 0, "delta": {"content": "a"}}]}
            yield ("data: " + json.dumps(chunk) + "\n\n").encode()
        yield b"data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")

config = hypercorn.config.Config()
config.bind = ["127.0.0.1:" + sys.argv[1]]
config.accesslog = None
app = Starlette(routes=[Route("/v1/models", models), Route("/health", models),
                        Route("/v1/chat/completions", chat, methods=["POST"])])
asyncio.run(hypercorn.asyncio.serve(app, config))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    def __init__(self, args: list[str], log: Path, url: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.url = url
        self._log = open(log, "wb")  # noqa: SIM115 - open while the process runs; close() closes it
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=env)

    def wait_ready(self, path: str = "/health") -> Process:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.url} exited")
            try:
                if httpx.get(self.url + path, timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.url} did not start")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


def modelyard(config: dict[str, Any], tmp: Path, name: str) -> Process:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    port = free_port()
    return Process([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path),
                    "--port", str(port), "--no-watch", "--log-level", "warning"],
                   tmp / f"{name}.log", f"http://127.0.0.1:{port}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency(direct: tuple[httpx.Client, str], front: tuple[httpx.Client, str],
            n: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"direct": [], "front": []}
    for i in range(n + 5):
        for path, (client, model) in (("direct", direct), ("front", front)):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 1, "temperature": 0}
            started = time.perf_counter()
            r = client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            if i >= 5:  # warm-up: connections, caches
                times[path].append(time.perf_counter() - started)
    added = [f - d for d, f in zip(times["direct"], times["front"])]
    return {"direct_p50_ms": 1000 * percentile(times["direct"], 0.5),
            "direct_p99_ms": 1000 * percentile(times["direct"], 0.99),
            "front_p50_ms": 1000 * percentile(times["front"], 0.5),
            "front_p99_ms": 1000 * percentile(times["front"], 0.99),
            "added_p50_ms": 1000 * percentile(added, 0.5),
            "added_p99_ms": 1000 * percentile(added, 0.99)}


def stream_rate(client: httpx.Client, model: str, max_tokens: int) -> float:
    """Chunks per second after the first chunk."""
    body = {"model": model, "messages": [{"role": "user", "content": "Tell a story."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "logit_bias": SMOLLM2_EOG}
    stamps = []
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise RuntimeError("the stream carried no tokens")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def streaming(direct: tuple[httpx.Client, str], front: tuple[httpx.Client, str], n: int,
              max_tokens: int) -> dict[str, float]:
    rates: dict[str, list[float]] = {"direct": [], "front": []}
    for i in range(n + 1):
        for path, (client, model) in (("direct", direct), ("front", front)):
            rate = stream_rate(client, model, max_tokens)
            if i >= 1:
                rates[path].append(rate)
    d, f = statistics.median(rates["direct"]), statistics.median(rates["front"])
    return {"direct_chunks_per_s": d, "front_chunks_per_s": f, "overhead_pct": 100 * (1 - f / d)}


def run(backend: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    started: list[Process] = []
    try:
        if backend == "model":
            target = modelyard({"models": [{"model": str(args.model), "aliases": ["m"],
                                            "n_ctx": 1024, "n_threads": args.threads}]},
                               tmp, "backend")
            model = "m"
        else:
            port = free_port()
            target = Process([sys.executable, "-c", ECHO_SERVER, str(port)], tmp / "echo.log",
                             f"http://127.0.0.1:{port}")
            model = "echo"
        started.append(target)
        target.wait_ready("/v1/models")
        front = modelyard({"models": [{"aliases": ["far"], "upstream": {
            "url": target.url, "model": model}}]}, tmp, f"front-{backend}")
        started.append(front)
        front.wait_ready()
        with httpx.Client(base_url=target.url, timeout=120) as d, \
                httpx.Client(base_url=front.url, timeout=120) as f:
            figures = latency((d, model), (f, "far"), args.requests)
            figures.update(streaming((d, model), (f, "far"), args.streams, args.max_tokens))
        return figures
    finally:
        for p in reversed(started):
            p.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path.home() / ".cache" / "modelyard" /
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--backend", choices=["model", "echo", "both"], default="both")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in (["echo", "model"] if args.backend == "both" else [args.backend]):
            figures = run(backend, args, Path(tmp))
            out[backend] = figures
            print(f"{backend} backend ({args.requests} requests, {args.streams} streams of "
                  f"{args.max_tokens} tokens):")
            print(f"  latency  direct p50 {figures['direct_p50_ms']:.2f} ms, p99 "
                  f"{figures['direct_p99_ms']:.2f} ms | front p50 {figures['front_p50_ms']:.2f}"
                  f" ms, p99 {figures['front_p99_ms']:.2f} ms | added p50 "
                  f"{figures['added_p50_ms']:.2f} ms, p99 {figures['added_p99_ms']:.2f} ms")
            print(f"  stream   direct {figures['direct_chunks_per_s']:.0f} chunks/s | front "
                  f"{figures['front_chunks_per_s']:.0f} chunks/s | overhead "
                  f"{figures['overhead_pct']:.1f}%")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
