"""An agent session replayed: time to first token per turn with the prompt cache, against a cold
prefill, for modelyard and llama.cpp's server in one run.

    flock /tmp/modelyard-bench.lock python scripts/bench_agent_replay.py \
        [--model ~/.cache/modelyard/SmolLM2-135M-Instruct.Q4_1.gguf] \
        [--other ~/.cache/modelyard/gemma-3-270m-q4_k_m.gguf] \
        [--peer-bin /work/llama/build/bin] [--threads 2] [--prefix-tokens 6000] [--only ours|peer]

The session (issue #30's): a system prompt and tool list of --prefix-tokens tokens, three
conversations of five turns each, interleaved (turn 1 of conversations 0, 1, 2, then turn 2 of
each, ...), each turn a short user message after the conversation so far (the earlier turns'
messages and replies), 16 greedy tokens generated, streamed through llama.cpp's /completion.
Between turns 3 and 4 another model is used under a one-model budget (modelyard: the --other
file in the same config with max_loaded_models 1, so the agent's model is evicted), and before
turn 5 the server restarts. Time to first token (the first streamed token) of every turn is
printed against turn 1 of conversation 0, the one cold prefill. Bars (the issue's): turns 2-3
<= 3% of it; turn 4 (after the eviction) and turn 5 (after the restart) <= 5%.

modelyard: n_ctx 8192, n_parallel 2, prompt_cache 2GiB, prompt_cache_disk 4GiB in a temporary
folder. llama-server: -c 16384 -np 2 (8192 per slot), --cache-ram 2048 (MiB), -t --threads; it
serves one model, so the eviction is what a one-model router does to it (the process stops
and starts again, as llama-swap does), and the restart is one more. Run it on a quiet machine:
figures of a shared one are only indications.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HOME = Path.home() / ".cache" / "modelyard"
TOOLS = ["read_file", "write_file", "list_dir", "run_command", "search_code", "apply_patch",
         "git_diff", "git_commit", "open_url", "ask_user"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prefix_text(words: int) -> str:
    """A system prompt and a JSON tool list, about `words` words long."""
    head = ("You are a coding agent working in a git repository. Read files before you change "
            "them, keep changes small, run the tests after each change, and explain what you "
            "did in one short paragraph. Never invent file contents. ")
    tools = []
    i = 0
    while len((head + json.dumps(tools)).split()) < words:
        name = TOOLS[i % len(TOOLS)] + (f"_{i // len(TOOLS)}" if i >= len(TOOLS) else "")
        tools.append({"type": "function", "function": {
            "name": name, "description": f"Tool {name}: operates on the workspace and returns "
                                         f"its result as text; call it with care, step {i}.",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "a path inside the repository"},
                "text": {"type": "string", "description": "the content or query"}},
                "required": ["path"]}}})
        i += 1
    return head + "\n# Tools\n" + json.dumps(tools, indent=1) + "\n"


class Server:
    def __init__(self, name: str, argv: list[str], port: int, env: dict[str, str] | None = None,
                 log: Path | None = None) -> None:
        self.name, self.argv, self.port, self.env = name, argv, port, env
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=out, env=self.env)
        import httpx

        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(self.name)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()  # SIGTERM: modelyard drains and writes its cache blocks
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc = None

    def ttft(self, prompt: str, model: str | None = None, n: int = 16) -> tuple[float, str, int]:
        """(seconds to the first streamed token, the text, cached prompt tokens)."""
        import httpx

        body: dict[str, Any] = {"prompt": prompt, "n_predict": n, "temperature": 0,
                                "stream": True, "cache_prompt": True}
        if model:
            body["model"] = model
        started = time.perf_counter()
        first, text, cached = None, [], 0
        with httpx.stream("POST", self.url + "/completion", json=body, timeout=3600) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{self.name}: {r.status_code} {r.read()[:300]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("content") and first is None:
                    first = time.perf_counter() - started
                text.append(event.get("content", ""))
                if event.get("stop"):
                    cached = int(event.get("timings", {}).get("cache_n", 0))
        return (first if first is not None else time.perf_counter() - started), "".join(text), cached


def replay(server: Server, prefix: str, evict: Any, restart: Any,
           model: str | None) -> list[list[tuple[float, int]]]:
    """TTFT and cached tokens per [conversation][turn]."""
    history = ["", "", ""]
    out: list[list[tuple[float, int]]] = [[], [], []]
    for turn in range(1, 6):
        if turn == 4:
            evict()
        if turn == 5:
            restart()
        for c in range(3):
            history[c] += (f"\nUser: conversation {c}, step {turn}: look at file "
                           f"src/mod_{c}_{turn}.py and fix the failing test.\nAssistant:")
            seconds, text, cached = server.ttft(prefix + history[c], model)
            history[c] += text
            out[c].append((seconds, cached))
            print(f"  {server.name} turn {turn} conversation {c}: TTFT {seconds:7.3f} s, "
                  f"cached {cached}", flush=True)
    return out


def ours(args: argparse.Namespace, folder: Path) -> tuple[Server, Any, Any]:
    config = {"registry": {"max_loaded_models": 1, "memory_budget": "8GiB"},
              "models": [
                  {"aliases": ["agent"], "model": str(args.model), "n_ctx": 8192,
                   "n_threads": args.threads, "n_parallel": 2, "prompt_cache": "2GiB",
                   "prompt_cache_disk": "4GiB", "prompt_cache_dir": str(folder / "blocks")},
                  {"aliases": ["other"], "model": str(args.other), "n_ctx": 2048,
                   "n_threads": args.threads, "n_parallel": 1}]}
    path = folder / "agent.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    port = _free_port()
    server = Server("modelyard", [sys.executable, "-m", "gateway.cli", "serve", "--config",
                                  str(path), "--port", str(port)], port, env,
                    folder / "modelyard.log")

    def evict() -> None:
        server.ttft("Hello", model="other", n=2)   # the one-model budget evicts the agent's

    def restart() -> None:
        server.stop()
        server.start()
    return server, evict, restart


def peer(args: argparse.Namespace, folder: Path) -> tuple[Server, Any, Any]:
    port = _free_port()
    server = Server("llama-server", [
        str(args.peer_bin / "llama-server"), "-m", str(args.model), "--port", str(port),
        "-t", str(args.threads), "-tb", str(args.threads), "-c", "16384", "-np", "2",
        "--cache-ram", "2048", "--no-webui"], port, log=folder / "llama-server.log")

    def swap() -> None:
        server.stop()
        server.start()
    return server, swap, swap


def table(name: str, runs: list[list[tuple[float, int]]]) -> list[str]:
    cold = runs[0][0][0]
    lines = [f"{name}: cold prefill (turn 1, conversation 0) {cold:.2f} s"]
    for turn in range(5):
        cells = [f"{runs[c][turn][0]:7.3f} s {100 * runs[c][turn][0] / cold:5.1f}% "
                 f"(cached {runs[c][turn][1]})" for c in range(3)]
        bar = "" if turn == 0 else (" bar 3%" if turn < 3 else " bar 5%")
        worst = max(runs[c][turn][0] for c in range(3)) / cold * 100
        ok = "" if turn == 0 else (" ok" if worst <= (3 if turn < 3 else 5) else " MISSED")
        lines.append(f"  turn {turn + 1}: " + " | ".join(cells) + bar + ok)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=HOME / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--other", type=Path, default=HOME / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--peer-bin", type=Path, default=Path("/work/llama/build/bin"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefix-tokens", type=int, default=6000)
    ap.add_argument("--only", choices=("ours", "peer"))
    args = ap.parse_args()
    results: dict[str, list[list[tuple[float, int]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sides = [("ours", ours), ("peer", peer)]
        for key, make in sides:
            if args.only and args.only != key:
                continue
            server, evict, restart = make(args, folder)
            server.start()
            try:
                import httpx

                words = int(args.prefix_tokens * 0.55)
                for _ in range(6):  # size the prefix in this model's tokens
                    prefix = prefix_text(words)
                    n = len(httpx.post(server.url + "/tokenize", json={"content": prefix},
                                       timeout=60).json()["tokens"])
                    if abs(n - args.prefix_tokens) < 0.03 * args.prefix_tokens:
                        break
                    words = int(words * args.prefix_tokens / n)
                print(f"{server.name}: prefix of {n} tokens", flush=True)
                results[server.name] = replay(server, prefix, evict, restart,
                                              "agent" if key == "ours" else None)
            finally:
                server.stop()
    print()
    for name, runs in results.items():
        print("\n".join(table(name, runs)))


if __name__ == "__main__":
    main()
