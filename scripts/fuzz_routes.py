"""Fuzz the routes of the API wave (issue #33): no request may get a 5xx.

Serves the gateway in process on 127.0.0.1 with the llava vlm reference model and its mmproj
(tests/data/vlm, so image parts reach a real projector) and a BERT cross-encoder reranker
(tests/data/encoders, for the rerank and embedding routes), then sends seeded bodies to each route:
instances generated from the route's pydantic request model (`model_json_schema()`), most of
them mutated (a wrong type, a required field dropped, a huge number, deep nesting, a huge string
within the body limit, a bad base64 image, a body that is not JSON), some streamed. After each
request /health must answer 200. Prints counts by route and status; exits 1 on any 5xx, on a
dropped connection or a silent /health, listing the requests that caused them.

    python scripts/fuzz_routes.py                 # 300 requests, seed 0
    python scripts/fuzz_routes.py -n 2000 --seconds 600 --seed 7
"""
from __future__ import annotations

import argparse
import base64
import collections
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo's packages

import httpx  # noqa: E402
import yaml  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from gateway.api.llama_protocol import CompletionRequest  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config import load_config  # noqa: E402
from gateway.protocol import anthropic, ollama, responses  # noqa: E402
from gateway.protocol.chat import ChatCompletionRequest  # noqa: E402
from gateway.protocol.embeddings import EmbeddingRequest  # noqa: E402
from gateway.protocol.rerank import RerankRequest  # noqa: E402
from tests.support.refs import ENCODERS_DIR, VLM_DIR  # noqa: E402
from tests.support.servers import ThreadedServer  # noqa: E402

BASE = next(b for b in json.loads((VLM_DIR / "manifest.json").read_text())["bases"]
            if b["base"] == "llava_mlp_vlm")
ALIAS = "fuzz-vlm"
RERANK_ALIAS = "fuzz-rerank"  # a cross-encoder: the rerank routes' model
RERANKER = ENCODERS_DIR / "bert_rerank_d64_l2_f32.gguf"
PNG_B64 = base64.b64encode((VLM_DIR / BASE["images"][0]["image"]).read_bytes()).decode()
BAD_B64 = ["not base64 at all!", "iVBORw0KGgo", base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64))
           .decode(), "", "====", base64.b64encode(b"GIF89a" + bytes(300)).decode()]

ROUTES: dict[str, type[BaseModel]] = {
    "/v1/messages": anthropic.MessageCreateRequest,
    "/v1/messages/count_tokens": anthropic.CountTokensRequest,
    "/v1/responses": responses.ResponsesRequest,
    "/v1/responses/input_tokens": responses.InputTokensRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/completion": CompletionRequest,
    "/api/chat": ollama.ChatRequest,
    "/api/generate": ollama.GenerateRequest,
    "/api/embed": ollama.EmbedRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/rerank": RerankRequest,
    "/rerank": RerankRequest,
    "/v1/reranking": RerankRequest,
}
# routes whose bodies name the reranker (most of the time; the other model otherwise)
RERANK_ROUTES = {"/v1/rerank", "/rerank", "/v1/reranking"}
# Fields whose values bound the work a request asks for: kept small in valid-ish bodies so a run
# measures robustness, not generation speed (the mutations still send huge ones).
BUDGET_KEYS = {"max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict",
               "num_predict", "n", "top_logprobs", "n_probs", "budget_tokens", "num_ctx"}
IMAGE_KEYS = {"url", "image_url", "data", "images", "multimodal_data", "file_data"}


def image_value(rng: random.Random, key: str) -> Any:
    """A valid or broken image in the shape `key` holds (a data URL, bare base64 or a list)."""
    b64 = PNG_B64 if rng.random() < 0.5 else rng.choice(BAD_B64)
    if key in ("url", "image_url"):
        return rng.choice([f"data:image/png;base64,{b64}", f"data:image/jpeg;base64,{b64}",
                           "data:,", "data:image/png;base64", "file:///etc/passwd",
                           "http://127.0.0.1:1/x.png"])
    return [b64] * rng.randint(0, 2) if key in ("images", "multimodal_data") else b64


class Generator:
    """Valid-ish instances of a JSON schema (pydantic's: $defs/$ref, anyOf, discriminators)."""

    def __init__(self, schema: dict[str, Any], rng: random.Random, alias: str = ALIAS) -> None:
        self.defs = schema.get("$defs", {})
        self.root = schema
        self.rng = rng
        self.alias = alias  # the model most bodies name

    def instance(self) -> Any:
        return self.value(self.root, "", 0)

    def value(self, s: dict[str, Any], key: str, depth: int) -> Any:  # noqa: C901, PLR0911
        rng = self.rng
        if "$ref" in s:
            return self.value(self.defs[s["$ref"].rsplit("/", 1)[-1]], key, depth)
        if "const" in s:
            return s["const"]
        if "enum" in s:
            return rng.choice(s["enum"])
        for many in ("anyOf", "oneOf"):
            if many in s:
                options = [o for o in s[many] if depth < 4 or o.get("type") != "object"]
                return self.value(rng.choice(options or s[many]), key, depth)
        if key in IMAGE_KEYS and rng.random() < 0.7:
            return image_value(rng, key)
        kind = s.get("type", rng.choice(["string", "integer", "object"]))
        if isinstance(kind, list):
            kind = rng.choice(kind)
        if kind == "object":
            return self.object(s, depth)
        if kind == "array":
            most = min(s.get("maxItems", 3), 3 if depth < 3 else 1)
            n = rng.randint(min(s.get("minItems", 0), most), most)
            return [self.value(s.get("items", {}), key, depth + 1) for _ in range(n)]
        if kind == "string":
            if key == "model":
                return self.alias if rng.random() < 0.9 else rng.choice(["", "nobody", "../x", ALIAS])
            if key == "role":
                return rng.choice(["user", "assistant", "system", "tool", "developer"])
            n = rng.randint(s.get("minLength", 0), min(s.get("maxLength", 12), 12))
            return "".join(rng.choice("ab cdé🙂\n<|>{}") for _ in range(n))
        if kind in ("integer", "number"):
            lo = s.get("minimum", s.get("exclusiveMinimum", -3))
            hi = s.get("maximum", s.get("exclusiveMaximum", lo + 8))
            hi = min(hi, lo + 8) if key in BUDGET_KEYS else hi
            x = rng.uniform(lo, hi)
            return round(x) if kind == "integer" else x
        if kind == "boolean":
            return rng.random() < 0.5
        return None

    def object(self, s: dict[str, Any], depth: int) -> dict[str, Any]:
        props: dict[str, Any] = s.get("properties", {})
        required = set(s.get("required", []))
        out = {}
        for name, sub in props.items():
            if name in required or self.rng.random() < 0.4:
                out[name] = self.value(sub, name, depth + 1)
        if props.get("model") is not None and "model" not in out:
            out["model"] = ALIAS
        return out


WRONG = [None, True, -1, 0, 1.5, "x", [], {}, [1, "a"], {"a": {"b": None}}]
HUGE = [2**63, -(2**63), 2**64 + 1, 10**30, 1e308, -1e308, 1e-320]


def paths(body: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside a JSON value (where a mutation may land)."""
    found = [prefix] if prefix else []
    items = body.items() if isinstance(body, dict) else enumerate(body) if isinstance(body, list) \
        else []
    for k, v in items:
        found += paths(v, (*prefix, k))
    return found


def mutate(body: dict[str, Any], rng: random.Random) -> tuple[str, Any]:
    """(what was done, the new body: JSON, or bytes when the body is not JSON)."""
    where = rng.choice(paths(body) or [("model",)])
    parent: Any = body
    for k in where[:-1]:
        parent = parent[k]
    last = where[-1]
    kind = rng.choice(["wrong_type", "drop", "huge_number", "deep", "huge_string", "bad_image",
                       "not_json", "top_level"])
    if kind == "drop":
        del parent[last]
    elif kind == "wrong_type":
        parent[last] = rng.choice(WRONG)
    elif kind == "huge_number":
        parent[last] = rng.choice(HUGE)
    elif kind == "deep":  # written as text: json.dumps itself recurses
        n = rng.choice([64, 600, 5000])
        opens = "".join(rng.choice(['[', '{"a":']) for _ in range(n))
        closes = "".join("]" if c == "[" else "}" for c in reversed(opens.replace('{"a":', "{")))
        parent[last] = "__DEEP__"
        return f"{kind} {n} at {'/'.join(map(str, where))}", json.dumps(body).replace(
            '"__DEEP__"', f'{opens}"x"{closes}', 1).encode()
    elif kind == "huge_string":
        parent[last] = rng.choice("a 🙂<") * rng.choice([10_000, 300_000])
    elif kind == "bad_image":
        parent[last] = image_value(rng, rng.choice(sorted(IMAGE_KEYS)))
    elif kind == "not_json":
        text = json.dumps(body)
        return kind, rng.choice([text[: rng.randint(0, len(text))].encode(), b"", b"\xff\xfe{",
                                 b"NaN", text.replace('"', "'").encode()])
    else:
        return kind, rng.choice([[], "x", 1, None, [body]])
    return f"{kind} at {'/'.join(map(str, where))}", body


def send(client: httpx.Client, path: str, body: Any) -> int:
    """The status of one request, reading a stream to its end."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with client.stream("POST", path, content=content,
                       headers={"content-type": "application/json"}) as reply:
        for _ in reply.iter_bytes():
            pass
        return reply.status_code


def serve(folder: Path) -> ThreadedServer:
    path = folder / "modelyard.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"model": str(VLM_DIR / BASE["text_file"]), "mmproj": str(VLM_DIR / BASE["mmproj_file"]),
         "aliases": [ALIAS], "n_ctx": 256},
        {"model": str(RERANKER), "aliases": [RERANK_ALIAS]}]}))
    server = ThreadedServer(create_app(load_config(path)))
    server.start_serving()
    return server


def run(url: str, count: int, seconds: float, seed: int,
        say: Callable[[str], None] = print) -> list[str]:
    """Send the requests; the failures, each with the request that caused it."""
    rng = random.Random(seed)
    schemas = {path: model.model_json_schema() for path, model in ROUTES.items()}
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    failures: list[str] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in range(count):
            if time.monotonic() > deadline:
                say(f"stopped at the --seconds bound after {i} requests")
                break
            path = rng.choice(list(ROUTES))
            alias = RERANK_ALIAS if path in RERANK_ROUTES else ALIAS
            body = Generator(schemas[path], rng, alias).instance()
            if "stream" in schemas[path].get("properties", {}) and rng.random() < 0.6:
                body["stream"] = rng.random() < 0.6
            what = "valid-ish"
            if rng.random() < 0.6:
                what, body = mutate(body, rng)
            shown = (body if isinstance(body, bytes) else json.dumps(body))[:2000]
            try:
                status = str(send(client, path, body))
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            counts[path, status] += 1
            if not status.isdigit() or int(status) >= 500:
                failures.append(f"#{i} POST {path} ({what}) -> {status}: {shown!r}")
            try:  # on a connection of its own: whether the server answers, not a reused socket
                health = httpx.get(url + "/health", timeout=30).status_code
            except httpx.HTTPError as exc:
                health = -1
                failures.append(f"#{i} /health failed after POST {path}: {exc!r}")
            if health != 200 and health != -1:
                failures.append(f"#{i} /health answered {health} after POST {path} ({what})")
    for (path, status), n in sorted(counts.items()):
        say(f"{path:30} {status:>20} {n:5}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--count", type=int, default=300, help="requests to send")
    parser.add_argument("--seconds", type=float, default=900.0, help="stop after this long")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = serve(Path(tmp))
        try:
            failures = run(server.url, args.count, args.seconds, args.seed)
        finally:
            server.stop()
    for line in failures:
        print("FAIL", line)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
