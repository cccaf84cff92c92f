"""Ollama's API (names and shapes from its docs/api.md and ollama-python's types).

    POST /api/chat         messages -> NDJSON stream or one object; no messages: load/unload
    POST /api/generate     prompt (`raw`: no template) -> likewise; empty prompt: load/unload
    POST /api/embed        input (one or many) -> L2-normalized embeddings, cut to the context
    POST /api/embeddings   the legacy form: prompt -> one raw embedding
    GET  /api/tags         every alias as `name:tag`, with size, digest and details
    POST /api/show         details, model_info (`<arch>.context_length`: the entry's n_ctx),
                           capabilities (completion, tools, embedding; thinking, vision),
                           template, parameters
    GET  /api/ps           loaded models with `expires_at` from keep_alive or the idle timeout
    GET  /api/version      the Ollama release whose API this follows
    GET  /                 "Ollama is running" (browsers get the console: gateway/api/console)
    pull, push, create, copy, delete, blobs: a 501 saying the config file manages models

Errors are Ollama's `{"error": "..."}` (registered below with gateway/errors.py shape_errors).
A name may carry `:latest` (Ollama's default tag): `smol:latest` is the alias `smol` unless an alias says
otherwise. Keys, per-key models and limits apply as on every route (gateway/http/auth.py).
chat, generate and the embeddings of an upstream alias go to its server's /api/* as received
(gateway/backends/dispatch.py): an Ollama upstream answers them.
"""
from __future__ import annotations

import asyncio
import hashlib
import math
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute

from engine.tool_formats import detect
from gateway import protocol as p
from gateway.api import admin, endpoints, model_info, ollama_wire, pipeline
from gateway.api.ollama_wire import created_at, ollama_name
from gateway.backends import dispatch
from gateway.config import Config, LimitSettings, ModelEntry
from gateway.errors import APIError, context_length_exceeded, shape_errors
from gateway.generation import defaults, embedding, serving
from gateway.generation.model import GenerativeModel
from gateway.http import auth
from gateway.http.streaming import cancel_on_disconnect
from gateway.protocol import ollama as o
from gateway.state import app_state

OLLAMA_VERSION = "0.12.0"  # the release whose API this follows; clients gate features on it
FOREVER = datetime(2318, 1, 1, tzinfo=UTC)  # Ollama's expires_at for keep_alive -1

PREFIX = "/api/"
shape_errors(PREFIX, ollama_wire.error_shape)


def resolve_name(config: Config, name: str) -> str:
    """The alias an Ollama name means: itself, or without Ollama's default tag `:latest`."""
    if name in config.aliases() or not name.endswith(":latest"):
        return name
    return name.removesuffix(":latest")


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


# --------------------------------------------------------------------------------- generation

async def chat(request: Request) -> Response:
    req = p.parse_request(o.ChatRequest, await request.body())
    req = req.model_copy(update={"model": resolve_name(app_state(request.app).config, req.model)})
    if not req.messages:
        return await _load_or_unload(request, req.model, req.keep_alive, generate=False)
    return await pipeline.generate(request, ollama_wire.CHAT, req)


async def generate(request: Request) -> Response:
    req = p.parse_request(o.GenerateRequest, await request.body())
    req = req.model_copy(update={"model": resolve_name(app_state(request.app).config, req.model)})
    if not req.prompt and not req.images:
        return await _load_or_unload(request, req.model, req.keep_alive, generate=True)
    return await pipeline.generate(request, ollama_wire.GENERATE, req)


async def _load_or_unload(request: Request, alias: str, keep_alive: p.KeepAlive,
                          generate: bool) -> Response:
    """Ollama's load-only request, or with keep_alive 0 its unload request."""
    state = app_state(request.app)
    if p.keep_alive_seconds(keep_alive) == 0:
        auth.check_model(request, alias)
        state.config.resolve(alias)  # 404 before anything else
        request.state.model = alias
        await state.registry.unload(alias, admin.UNLOAD_TIMEOUT)
        reason = "unload"
    else:
        lease, _ = await pipeline.acquire(request, alias, keep_alive)
        state.registry.release(lease)
        reason = "load"
    body: dict[str, Any] = {"model": ollama_name(alias), "created_at": created_at()}
    if generate:
        body["response"] = ""
    else:
        body["message"] = {"role": "assistant", "content": ""}
    return JSONResponse({**body, "done": True, "done_reason": reason})


# --------------------------------------------------------------------------------- embeddings

def _embedding_ids(served: GenerativeModel, texts: list[str], truncate: bool,
                   limits: LimitSettings) -> list[list[int]]:
    if not texts:
        raise p.RequestValidationError("input must not be empty: nothing to embed", "input")
    out = []
    for i, text in enumerate(texts):
        serving.check_prompt_size(served, text, limits, "input", fits_context=False)
        ids = served.tokenizer.encode(text, add_special=True, parse_special=True)  # as llama-server
        if not ids:
            raise p.RequestValidationError(f"input[{i}] is empty: nothing to embed", "input")
        if len(ids) > served.n_ctx:
            if not truncate:
                raise context_length_exceeded(len(ids), served.n_ctx, "input")
            ids = ids[:served.n_ctx]
        out.append(ids)
    return out


async def _vectors(request: Request, alias: str, keep_alive: p.KeepAlive, texts: list[str],
                   truncate: bool, options: o.Options | None,
                   dimensions: int | None = None) -> tuple[list[np.ndarray], int]:
    """One vector per text and the tokens read, on a lease released before returning."""
    state = app_state(request.app)
    lease, metrics = await pipeline.acquire(request, alias, keep_alive)
    try:
        served = lease.model
        if options is not None and options.num_ctx not in (None, served.n_ctx):
            raise p.RequestValidationError(
                f"options.num_ctx is {options.num_ctx}, but this model is served with a "
                f"context of {served.n_ctx} tokens (the config file's n_ctx)", "options.num_ctx")
        ids = await serving.off_loop(served, _embedding_ids, served, texts, truncate,
                                     state.config.limits)
        reply = await cancel_on_disconnect(request, embedding.embeddings(
            served, alias, p.EmbeddingRequest(input=ids, dimensions=dimensions),
            state.config.limits, metrics))
        vectors = [np.asarray(e.embedding, dtype=np.float32) for e in reply.data]
        return vectors, reply.usage.prompt_tokens
    finally:
        state.registry.release(lease)


async def embed(request: Request) -> Response:
    started = time.perf_counter()
    req = p.parse_request(o.EmbedRequest, await request.body())
    alias = resolve_name(app_state(request.app).config, req.model)
    vectors, tokens = await _vectors(request, alias, req.keep_alive, req.inputs(), req.truncate,
                                     req.options, req.dimensions)
    normalized = []
    for v in vectors:  # Ollama's /api/embed returns unit vectors
        norm = float(np.linalg.norm(v))
        normalized.append([float(x) for x in (v / norm if norm > 0 else v)])
    return JSONResponse({"model": ollama_name(alias), "embeddings": normalized,
                         "total_duration": int((time.perf_counter() - started) * 1e9),
                         "load_duration": 0, "prompt_eval_count": tokens})


async def embeddings(request: Request) -> Response:
    req = p.parse_request(o.EmbeddingsRequest, await request.body())
    alias = resolve_name(app_state(request.app).config, req.model)
    if not req.prompt:  # Ollama answers an empty prompt with an empty vector (it loads the model)
        lease, _ = await pipeline.acquire(request, alias, req.keep_alive)
        app_state(request.app).registry.release(lease)
        return JSONResponse({"embedding": []})
    vectors, _ = await _vectors(request, alias, req.keep_alive, [req.prompt], True, req.options)
    return JSONResponse({"embedding": [float(x) for x in vectors[0]]})


# --------------------------------------------------------------------------------- model lists

def _parameter_size(n: int | None) -> str:
    if not n:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _file_facts(entry: ModelEntry) -> tuple[model_info.ModelFacts, float]:
    facts = model_info.facts(entry.model)
    try:
        mtime = os.stat(entry.model).st_mtime
    except OSError:
        mtime = 0.0
    return facts, mtime


def _digest(entry: ModelEntry, facts: model_info.ModelFacts, mtime: float) -> str:
    """An identity of the file version (path, size, mtime), not a hash of its bytes."""
    return hashlib.sha256(f"{entry.model}:{facts.size_bytes}:{mtime}".encode()).hexdigest()


def _details(facts: model_info.ModelFacts) -> dict[str, Any]:
    arch = facts.architecture or ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": _parameter_size(facts.n_params),
            "quantization_level": facts.quantization or ""}


async def _visible(request: Request) -> list[tuple[str, ModelEntry, model_info.ModelFacts, float]]:
    """(alias, entry, facts, mtime) for every local alias the request's key may see."""
    config = app_state(request.app).config
    visible = auth.visible_aliases(request, config.aliases())
    entries = [(alias, entry) for entry in config.models for alias in entry.aliases
               if visible is None or alias in visible]
    found = await asyncio.gather(*(asyncio.to_thread(_file_facts, e) for _, e in entries))
    return [(alias, entry, facts, mtime) for (alias, entry), (facts, mtime) in zip(entries, found)]


async def tags(request: Request) -> Response:
    models = [{"name": ollama_name(alias), "model": ollama_name(alias), "modified_at": _iso(mtime),
               "size": facts.size_bytes, "digest": _digest(entry, facts, mtime),
               "details": _details(facts)}
              for alias, entry, facts, mtime in await _visible(request)]
    return JSONResponse({"models": models})


def _expires_at(row: dict[str, Any], entry: ModelEntry, config: Config) -> str:
    keep = row.get("keep_alive")
    if keep == -1 or entry.pinned:
        return _iso(FOREVER.timestamp())
    timeout = keep if keep else (entry.idle_timeout if entry.idle_timeout is not None
                                 else config.registry.idle_timeout)
    if not timeout or math.isinf(timeout):  # idle_timeout 0: never unloaded for idleness
        return _iso(FOREVER.timestamp())
    since = time.time() if row.get("in_flight") else (row.get("last_used") or time.time())
    return _iso(since + float(timeout))


async def ps(request: Request) -> Response:
    state = app_state(request.app)
    rows = {r["model"]: r for r in state.registry.snapshot()
            if r["state"] == "ready" and not r["retiring"]}
    models = []
    for alias, entry, facts, mtime in await _visible(request):
        row = rows.get(str(entry.model))
        if row is None or alias not in row["aliases"]:
            continue
        models.append({"name": ollama_name(alias), "model": ollama_name(alias),
                       "size": row["memory_bytes"], "digest": _digest(entry, facts, mtime),
                       "details": _details(facts),
                       "expires_at": _expires_at(dict(row), entry, state.config),
                       "size_vram": 0, "context_length": entry.n_ctx})
    return JSONResponse({"models": models})


def capabilities(template: str | None, entry: ModelEntry) -> list[str]:
    """What /api/show says a model does: every entry completes, takes tools (formats without
    native calls get the generic one) and embeds (/api/embed); `thinking` when its template
    opens <think>, `vision` when the entry has an image projector (mmproj)."""
    out = ["completion", "tools"]
    if detect(template).thinking:
        out.append("thinking")
    if entry.mmproj is not None:
        out.append("vision")
    return out + ["embedding"]


async def show(request: Request) -> Response:
    req = p.parse_request(o.ShowRequest, await request.body())
    state = app_state(request.app)
    name = req.named()
    if name is None:
        raise p.RequestValidationError("'model' is required", "model")
    alias = resolve_name(state.config, name)
    entry = state.config.resolve(alias)  # 404 for an unknown name
    auth.check_model(request, alias)
    request.state.model = alias
    facts, mtime = await asyncio.to_thread(_file_facts, entry)
    arch = facts.architecture or "unknown"
    template = entry.chat_template if entry.chat_template is not None else facts.chat_template
    sampling = defaults.effective(entry, facts.sampling)
    parameters = [f"num_ctx {entry.n_ctx}"] + [
        f"{name} {value}" for name, value in sampling.as_dict().items()
        if name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")]
    return JSONResponse({
        "modelfile": f"# modelyard serves this model from its config file\n"
                     f"FROM {Path(entry.model).name}\n",
        "parameters": "\n".join(parameters),
        "template": template or "",
        "details": _details(facts),
        "model_info": {"general.architecture": arch,
                       "general.parameter_count": facts.n_params or 0,
                       f"{arch}.context_length": entry.n_ctx},
        "capabilities": (capabilities(template, entry) if facts.role(entry.pooling) == "generation"
                         else facts.capabilities(entry.pooling)),
        "modified_at": _iso(mtime),
    })


async def version(request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_VERSION})


async def running(request: Request) -> Response:
    """GET / for what is not a browser (gateway/api/console answers browsers): Ollama's
    liveness answer, which its CLI, ollama-python users and Open WebUI probe for."""
    return PlainTextResponse("Ollama is running")


async def managed_by_config(request: Request) -> Response:
    source = app_state(request.app).config.source
    where = f" ({source.name})" if source is not None else ""
    raise APIError(501, f"{request.url.path} is not available here: modelyard serves the models "
                        f"its config file{where} names. Add, change or remove an entry there; "
                        "the server reloads it.", code="models_managed_by_config")


ENDPOINTS: endpoints.Table = {
    "POST /api/chat": dispatch.forwarding("/api/chat", chat, at_root=True),
    "POST /api/generate": dispatch.forwarding("/api/generate", generate, at_root=True),
    "POST /api/embed": dispatch.forwarding("/api/embed", embed, at_root=True),
    "POST /api/embeddings": dispatch.forwarding("/api/embeddings", embeddings, at_root=True),
    "GET /api/tags": tags,
    "POST /api/show": show,
    "GET /api/ps": ps,
    "GET /api/version": version,
    "POST /api/pull": managed_by_config,
    "POST /api/push": managed_by_config,
    "POST /api/create": managed_by_config,
    "POST /api/copy": managed_by_config,
    "DELETE /api/delete": managed_by_config,
    "HEAD POST /api/blobs/{digest}": managed_by_config,
}


def routes() -> list[BaseRoute]:
    return endpoints.routes(ENDPOINTS)
