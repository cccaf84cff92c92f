"""llama.cpp's server API beside OpenAI's (names and shapes from llama.cpp's tools/server/README.md).

    POST /completion       prompt (text, token ids, or a mix; several prompts -> an array),
                           n_predict, stream, sampling fields, n_probs, return_tokens,
                           response_fields, timings
    POST /tokenize         {content, add_special, parse_special, with_pieces} -> {tokens}
    POST /detokenize       {tokens} -> {content}
    POST /apply-template   {messages} -> {prompt}: the chat template's text, no generation
    POST /chat/completions/input_tokens  (and under /v1) a chat body -> {input_tokens}
    GET  /props            ?model=: default_generation_settings, total_slots, model_path, ...
    GET  /slots            ?model=: read-only view of the model's slots (?fail_on_no_slot=1)
    POST /slots/{id}       ?action=save|restore|erase: a slot to and from a file (gateway/api/slots.py)
    GET  /v1/health        as /health
    POST /models/load      {model} -> {success: true}    (llama.cpp's router API; admin key)
    POST /models/unload    {model} -> {success: true}
    GET|POST /lora-adapters  the entry's LoRA adapters (gateway/api/lora_adapters.py)
    (GET /models, the router's list with `status`, is OpenAI's list route: gateway/api/openai.py)

Where a route is OpenAI's too (/completions, /models, /embeddings), OpenAI's shape wins. Every
route names its model by `model` (body, or query for GET) and defaults to the default model, as
llama.cpp's router does. Generation runs on the same scheduler as /v1, with the same defaults
(gateway/generation/defaults.py): n_predict -1 (or missing) is the chat budget, not "until n_ctx".
"""
from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from gateway.api import (
    admin,
    endpoints,
    llama_completion,
    lora_adapters,
    model_info,
    openai_wire,
    pipeline,
)
from gateway.api import llama_protocol as lp
from gateway.api import slots as slot_files
from gateway.api.llama_completion import SEED_RANDOM
from gateway.backends import dispatch
from gateway.config import LimitSettings
from gateway.errors import APIError, invalid_request
from gateway.fleet.registry import Lease
from gateway.generation import defaults, reasoning, serving
from gateway.generation.images import MEDIA_MARKER
from gateway.generation.model import GenerativeModel
from gateway.protocol import ChatCompletionRequest, parse_request
from gateway.state import app_state
from gateway.version import version


async def completion(request: Request) -> Response:
    """Through the backend seam as /v1's routes: a pool or an upstream entry serves it too."""
    return await dispatch.serve(request, "/completion", _local_completion, at_root=True)


async def _local_completion(request: Request, body: bytes, local: str | None,
                            shown: str | None) -> Response:
    req = parse_request(lp.CompletionRequest, body)
    if local is not None:  # a pool's local member
        req = req.model_copy(update={"model": local})
    return await pipeline.generate(request, llama_completion.COMPLETION, req, shown)


# --------------------------------------------------------------------------------- tokens, template

def _piece(raw: bytes) -> str | list[int]:
    """A token's text, or its bytes when they are not valid UTF-8 on their own (llama.cpp)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def _with_model(request: Request, model: str | None) -> tuple[Lease, GenerativeModel]:
    lease, _ = await pipeline.acquire(request, model)  # no generation: nothing to observe
    return lease, lease.model


async def tokenize(request: Request) -> Response:
    req = parse_request(lp.TokenizeRequest, await request.body())
    lease, served = await _with_model(request, req.model)
    try:
        limits = app_state(request.app).config.limits
        return JSONResponse(await serving.off_loop(served, _tokens, served, req, limits))
    finally:
        app_state(request.app).registry.release(lease)


def _tokens(served: GenerativeModel, req: lp.TokenizeRequest, limits: LimitSettings) -> dict[str, Any]:
    """/tokenize's answer, computed in the model's prep threads under the prompt size limit."""
    serving.check_prompt_size(served, req.content, limits, "content", fits_context=False)
    tok = served.tokenizer
    ids = tok.encode(req.content, add_special=req.add_special, parse_special=req.parse_special)
    if not req.with_pieces:
        return {"tokens": list(ids)}
    return {"tokens": [{"id": t, "piece": _piece(tok.token_bytes(t))} for t in ids]}


async def detokenize(request: Request) -> Response:
    req = parse_request(lp.DetokenizeRequest, await request.body())
    lease, served = await _with_model(request, req.model)
    try:
        n_vocab = served.n_vocab
        if any(not 0 <= t < n_vocab for t in req.tokens):
            raise invalid_request(f"token ids must be in 0..{n_vocab - 1}", "tokens")
        text = await serving.off_loop(served, served.tokenizer.decode, req.tokens)
        return JSONResponse({"content": text})
    finally:
        app_state(request.app).registry.release(lease)


async def apply_template(request: Request) -> Response:
    req = parse_request(lp.ApplyTemplateRequest, await request.body())
    lease, served = await _with_model(request, req.model)
    try:
        limits = app_state(request.app).config.limits
        # the variables the chat route would give the template: the entry's reasoning
        # defaults under the request's chat_template_kwargs (enable_thinking, ...)
        chat = ChatCompletionRequest(messages=req.messages,
                                     chat_template_kwargs=req.chat_template_kwargs)
        settings = reasoning.settings(reasoning.with_entry_defaults(chat, lease.entry))
        variables = served.tool_format.template_vars(dict(settings.template_vars))
        text = await serving.off_loop(
            served, partial(served.chat_template.render,
                            add_generation_prompt=req.add_generation_prompt,
                            tools=req.tools or None, variables=variables,
                            time_budget=limits.template_timeout, max_chars=limits.max_prompt),
            [m.for_template() for m in req.messages])
        return JSONResponse({"prompt": text})
    finally:
        app_state(request.app).registry.release(lease)


async def chat_input_tokens(request: Request) -> Response:
    """POST /chat/completions/input_tokens: {"input_tokens": n}, the prompt positions the same
    body would be planned with on /v1/chat/completions (the entry's defaults applied)."""
    return await dispatch.serve(request, "/chat/completions/input_tokens", _local_chat_tokens)


async def _local_chat_tokens(request: Request, body: bytes, local: str | None,
                             shown: str | None) -> Response:
    req = parse_request(ChatCompletionRequest, body)
    if local is not None:  # a pool's local member
        req = req.model_copy(update={"model": local})
    lease, _ = await pipeline.acquire(request, req.model, req.keep_alive, shown)
    try:
        chat = openai_wire.with_defaults(req, lease, lease.model)
        n = await serving.count_chat_tokens(lease.model, chat,
                                            app_state(request.app).config.limits)
        return JSONResponse({"input_tokens": n})
    finally:
        app_state(request.app).registry.release(lease)


# --------------------------------------------------------------------------------- props, slots

def _entry_and_row(request: Request) -> tuple[Any, dict[str, Any]]:
    """The entry `?model=` names (default: the default model) and its registry row; loads
    nothing (llama.cpp's router does not wake a model for these either)."""
    from gateway.http.auth import check_model

    config = app_state(request.app).config
    alias = request.query_params.get("model")
    entry = config.resolve(alias)
    check_model(request, alias or entry.name)
    request.state.model = alias or entry.name
    rows = [r for r in app_state(request.app).registry.snapshot()
            if r["model"] == str(entry.model) and not r["retiring"]]
    return entry, dict(rows[0]) if rows else {}


def _default_params(entry: Any, facts: model_info.ModelFacts) -> dict[str, Any]:
    values = defaults.effective(entry, facts.sampling).as_dict()
    budget = defaults.chat_max_tokens(entry, entry.n_ctx)
    seed = SEED_RANDOM if entry.seed is None else entry.seed
    return {"n_predict": budget, "max_tokens": budget, "seed": seed, **values, "stop": [],
            "n_probs": 0, "stream": False, "ignore_eos": False}


async def props(request: Request) -> Response:
    entry, row = _entry_and_row(request)
    facts = await asyncio.to_thread(model_info.facts, entry.model)
    active = row.get("active", 0)
    template = entry.chat_template if entry.chat_template is not None else facts.chat_template
    return JSONResponse({
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": entry.n_ctx, "speculative": False,
            "is_processing": active > 0, "params": _default_params(entry, facts)},
        "total_slots": entry.n_parallel,
        "model_path": entry.model.name,  # the file's name: where it lies is not a client's business
        "model_alias": entry.name,
        "chat_template": template or "",
        "chat_template_caps": {},
        "modalities": {"vision": entry.mmproj is not None, "audio": False},
        "media_marker": MEDIA_MARKER,  # where multimodal_data's images go in a prompt
        "build_info": f"modelyard {version()}",
        "is_sleeping": row.get("state") != "ready",
    })


async def slots(request: Request) -> Response:
    entry, row = _entry_and_row(request)
    facts = await asyncio.to_thread(model_info.facts, entry.model)
    active = row.get("active", 0)  # which slot runs what is the scheduler's; the count is true
    if request.query_params.get("fail_on_no_slot") in ("1", "true") and active >= entry.n_parallel:
        raise APIError(503, "no slot available", type="unavailable_error", code="no_slot_available")
    params = _default_params(entry, facts)
    return JSONResponse([{
        "id": i, "id_task": -1, "n_ctx": entry.n_ctx, "speculative": False,
        "is_processing": i < active, "params": params,
        "next_token": {"has_next_token": i < active, "has_new_line": False, "n_remain": -1,
                       "n_decoded": 0},
    } for i in range(entry.n_parallel)])


# --------------------------------------------------------------------------------- router API

async def load_model(request: Request) -> Response:
    req = parse_request(lp.RouterModelRequest, await request.body())
    app_state(request.app).config.resolve(req.model)  # 404 model_not_found before anything else
    request.state.model = req.model
    await app_state(request.app).registry.load(req.model)
    return JSONResponse({"success": True})


async def unload_model(request: Request) -> Response:
    req = parse_request(lp.RouterModelRequest, await request.body())
    app_state(request.app).config.resolve(req.model)
    request.state.model = req.model
    await app_state(request.app).registry.unload(req.model, admin.UNLOAD_TIMEOUT)
    return JSONResponse({"success": True})


ENDPOINTS: endpoints.Table = {
    "POST /completion": completion,
    "POST /tokenize": tokenize,
    "POST /detokenize": detokenize,
    "POST /apply-template": apply_template,
    "POST /chat/completions/input_tokens": chat_input_tokens,
    "POST /v1/chat/completions/input_tokens": chat_input_tokens,
    "GET /props": props,
    "GET /slots": slots,
    "POST /slots/{id_slot}": slot_files.slot_action,
    "GET /v1/health": admin.health,
    "POST /models/load": load_model,
    "POST /models/unload": unload_model,
    "GET /lora-adapters": lora_adapters.list_adapters,
    "POST /lora-adapters": lora_adapters.set_adapters,
}


def routes() -> list[BaseRoute]:
    return endpoints.routes(ENDPOINTS)
