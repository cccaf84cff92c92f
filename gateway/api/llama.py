"""llama.cpp's server API beside OpenAI's (names and shapes from llama.cpp's tools/server/README.md).

    POST /completion       prompt (text, token ids, or a mix; several prompts -> an array),
                           n_predict, stream, sampling fields, n_probs, return_tokens,
                           response_fields, timings
    POST /tokenize         {content, add_special, parse_special, with_pieces} -> {tokens}
    POST /detokenize       {tokens} -> {content}
    POST /apply-template   {messages} -> {prompt}: the chat template's text, no generation
    GET  /props            ?model=: default_generation_settings, total_slots, model_path, ...
    GET  /slots            ?model=: read-only view of the model's slots (?fail_on_no_slot=1)
    GET  /v1/health        as /health
    POST /models/load      {model} -> {success: true}    (llama.cpp's router API; admin key)
    POST /models/unload    {model} -> {success: true}
    (GET /models, the router's list with `status`, is OpenAI's list route: gateway/api/openai.py)

Where a route is OpenAI's too (/completions, /models, /embeddings), OpenAI's shape wins. Every
route names its model by `model` (body, or query for GET) and defaults to the default model, as
llama.cpp's router does. Generation runs on the same scheduler as /v1, with the same defaults
(gateway/generation/defaults.py): n_predict -1 (or missing) is the chat budget, not "until n_ctx".
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

import engine
from gateway.api import admin, endpoints, model_info
from gateway.api import llama_protocol as lp
from gateway.api.openai import acquire
from gateway.config import LimitSettings
from gateway.errors import APIError, context_length_exceeded, invalid_request
from gateway.fleet.registry import Lease
from gateway.generation import defaults, serving
from gateway.generation.events import Finished, GenerationRequest, TextDelta, TokenInfo
from gateway.generation.model import GenerativeModel
from gateway.http.streaming import EventStreamResponse, cancel_on_disconnect
from gateway.protocol import parse_request
from gateway.state import app_state
from gateway.version import version

BANNED = -1e9          # a logit bias that no sampler gets past (llama.cpp's `false`)
SEED_RANDOM = 4294967295  # how llama.cpp shows seed -1


# --------------------------------------------------------------------------------- planning

def _sampling(req: lp.CompletionRequest, lease: Lease, served: GenerativeModel) -> dict[str, Any]:
    """The request's sampling values, what it left out from the entry/GGUF/llama.cpp defaults."""
    base = defaults.effective(lease.entry, served.sampling_defaults).as_dict()
    sent = {k: getattr(req, k) for k in defaults.SAMPLING_FIELDS if getattr(req, k) is not None}
    return {**base, **sent}


def _logit_bias(req: lp.CompletionRequest, served: GenerativeModel) -> dict[int, float]:
    n_vocab = served.n_vocab
    pairs: list[tuple[Any, Any]] = []
    if isinstance(req.logit_bias, dict):
        pairs = [(int(k) if k.isdigit() else k, v) for k, v in req.logit_bias.items()]
    elif req.logit_bias is not None:
        for item in req.logit_bias:
            if len(item) != 2:
                raise invalid_request("logit_bias items must be [token, bias] pairs", "logit_bias")
            pairs.append((item[0], item[1]))
    out: dict[int, float] = {}
    for token, bias in pairs:
        if bias is False:
            value = BANNED
        elif isinstance(bias, int | float) and not isinstance(bias, bool):
            value = float(bias)
        else:
            raise invalid_request(f"logit_bias: the bias of {token!r} must be a number or false",
                                  "logit_bias")
        if isinstance(token, str):  # every token of the text, as llama.cpp does
            ids = served.tokenizer.encode(token, add_special=False, parse_special=False)
        elif isinstance(token, int) and not isinstance(token, bool) and 0 <= token < n_vocab:
            ids = [token]
        else:
            raise invalid_request(f"logit_bias token {token!r} is outside the vocabulary "
                                  f"(0..{n_vocab - 1})", "logit_bias")
        for t in ids:
            out[t] = value
    if req.ignore_eos:
        out.update(dict.fromkeys(served.tokenizer.eog_ids, BANNED))
    return out


def _prompt_ids(served: GenerativeModel, parts: list[int | str], limits: LimitSettings) -> list[int]:
    """A prompt of texts and ids as token ids; BOS (if the model wants it) before a leading text.
    Texts pass the same size checks as the OpenAI routes' prompts (serving.check_prompt_size)."""
    n_vocab = served.n_vocab
    ids: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            serving.check_prompt_size(served, part, limits, "prompt")
            ids += (served.text_prompt(part) if i == 0 else
                    served.tokenizer.encode(part, add_special=False, parse_special=True))
        elif 0 <= part < n_vocab:
            ids.append(part)
        else:
            raise invalid_request(f"prompt token ids must be in 0..{n_vocab - 1}", "prompt")
    return ids


def _seed(req: lp.CompletionRequest, lease: Lease) -> int | None:
    """The request's seed; -1 (random) takes the entry's seed when it has one."""
    return req.seed if req.seed >= 0 else lease.entry.seed


def _settings(values: dict[str, Any], req: lp.CompletionRequest, n_ctx: int, n_predict: int,
              alias: str, seed: int | None) -> dict[str, Any]:
    """llama.cpp's `generation_settings` (also /props' and /slots' `params`)."""
    return {"n_ctx": n_ctx, "model": alias, "n_predict": n_predict, "max_tokens": n_predict,
            "seed": SEED_RANDOM if seed is None else seed, **values, "stop": list(req.stop),
            "n_probs": req.n_probs, "stream": req.stream, "ignore_eos": req.ignore_eos,
            "cache_prompt": req.cache_prompt}


def _plan(req: lp.CompletionRequest, lease: Lease, served: GenerativeModel, limits: LimitSettings
          ) -> tuple[list[list[int]], list[str], list[GenerationRequest], dict[str, Any]]:
    """Runs in the model's prep threads (tokenizing is CPU work): the prompts' ids and texts,
    one generation per prompt, and llama.cpp's generation_settings."""
    values = _sampling(req, lease, served)
    greedy = values["temperature"] <= 0 or values["top_p"] == 0
    budget = (defaults.chat_max_tokens(lease.entry, served.n_ctx) if req.n_predict < 0
              else req.n_predict)
    params = engine.SamplingParams(
        temperature=0.0 if greedy else values["temperature"], top_k=max(0, values["top_k"]),
        top_p=1.0 if greedy else values["top_p"], min_p=values["min_p"],
        repeat_penalty=values["repeat_penalty"], presence_penalty=values["presence_penalty"],
        frequency_penalty=values["frequency_penalty"], logit_bias=_logit_bias(req, served),
        seed=_seed(req, lease), top_logprobs=req.n_probs,
        logprobs=bool(req.n_probs))
    prompts = [_prompt_ids(served, parts, limits) for parts in req.prompts()]
    requests = []
    for ids in prompts:
        if not ids:
            raise invalid_request("prompt is empty after tokenizing", "prompt")
        if len(ids) >= served.n_ctx:
            raise context_length_exceeded(len(ids), served.n_ctx, "prompt")
        requests.append(GenerationRequest(
            prompt_ids=ids, params=params, max_tokens=min(budget, served.n_ctx - len(ids)),
            stop=tuple(s for s in req.stop if s), logprobs=True))  # token ids come with logprobs
    texts = [served.tokenizer.decode(ids) for ids in prompts]
    return prompts, texts, requests, _settings(values, req, served.n_ctx, budget, lease.alias,
                                               _seed(req, lease))


# --------------------------------------------------------------------------------- responses

def _piece(raw: bytes) -> str | list[int]:
    """A token's text, or its bytes when they are not valid UTF-8 on their own (llama.cpp)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _probs(tokens: list[TokenInfo]) -> list[dict[str, Any]]:
    return [{"id": t.token, "token": t.text, "bytes": list(t.bytes), "logprob": t.logprob,
             "top_logprobs": [{"id": i, "token": text, "bytes": list(raw), "logprob": lp}
                              for i, (text, raw, lp) in zip(t.top_ids, t.top)]}
            for t in tokens]


def _timings(done: Finished) -> dict[str, Any]:
    prompt_n = done.prompt_tokens - done.cached_tokens
    prompt_ms, predicted_ms = done.prompt_seconds * 1000, done.predicted_seconds * 1000
    n = done.completion_tokens
    return {"cache_n": done.cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / done.prompt_seconds if done.prompt_seconds else 0.0,
            "predicted_n": n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n if n else 0.0,
            "predicted_per_second": n / done.predicted_seconds if done.predicted_seconds else 0.0}


def _final(index: int, text: str, ids: list[int], tokens: list[TokenInfo], done: Finished,
           req: lp.CompletionRequest, settings: dict[str, Any], prompt: str, n_ctx: int,
           streamed: bool) -> dict[str, Any]:
    stop_type = "word" if done.stop_word else "limit" if done.finish_reason == "length" else "eos"
    out: dict[str, Any] = {
        "index": index, "content": "" if streamed else text,
        "tokens": ids if req.return_tokens and not streamed else [], "id_slot": -1, "stop": True,
        "model": settings["model"], "tokens_predicted": done.completion_tokens,
        "tokens_evaluated": done.prompt_tokens, "generation_settings": settings,
        "prompt": prompt, "has_new_line": "\n" in text,
        "truncated": done.prompt_tokens + done.completion_tokens >= n_ctx,
        "stop_type": stop_type, "stopping_word": done.stop_word,
        "tokens_cached": done.cached_tokens, "timings": _timings(done),
    }
    if req.n_probs and not streamed:
        out["completion_probabilities"] = _probs(tokens)
    return out


async def _collect(generation: Any) -> tuple[str, list[TokenInfo], Finished]:
    parts: list[str] = []
    tokens: list[TokenInfo] = []
    async for event in generation:
        if isinstance(event, TextDelta):
            parts.append(event.text)
            tokens.extend(event.tokens)
        elif isinstance(event, Finished):
            return "".join(parts), tokens, event
    raise RuntimeError("a generation ended without finishing")  # the scheduler always finishes


def _only_fields(body: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama.cpp's `response_fields`: keep these; "a/b" moves a["b"] to the top as "a/b"."""
    if not fields:
        return body
    out: dict[str, Any] = {}
    for name in fields:
        value: Any = body
        for part in name.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[name] = value
    return out


def _evaluated_only(index: int, ids: list[int], req: lp.CompletionRequest,
                    settings: dict[str, Any], prompt: str, n_ctx: int) -> dict[str, Any]:
    """n_predict 0: nothing generated (llama.cpp then only fills the cache)."""
    return _final(index, "", [], [], Finished("length", len(ids), 0), req, settings, prompt,
                  n_ctx, streamed=False)


async def _stream(plan: serving.Plan, req: lp.CompletionRequest, settings: dict[str, Any],
                  prompt: str, n_ctx: int) -> AsyncIterator[dict[str, Any]]:
    generation = plan.submitted[0]
    count = 0
    tokens: list[TokenInfo] = []
    text: list[str] = []
    try:
        async for event in generation:
            if isinstance(event, TextDelta):
                count += len(event.tokens)
                tokens += event.tokens
                text.append(event.text)
                chunk: dict[str, Any] = {
                    "index": 0, "content": event.text, "tokens": [t.token for t in event.tokens],
                    "stop": False, "id_slot": -1, "model": settings["model"],
                    "tokens_predicted": count, "tokens_evaluated": len(plan.requests[0].prompt_ids)}
                if req.n_probs:
                    chunk["completion_probabilities"] = _probs(event.tokens)
                yield chunk
            elif isinstance(event, Finished):
                yield _final(0, "".join(text), [], tokens, event, req, settings, prompt, n_ctx,
                             streamed=True)
    finally:
        plan.cancel()  # the client left early: the slot is freed at the next step


async def completion(request: Request) -> Response:
    req = parse_request(lp.CompletionRequest, await request.body())
    registry = app_state(request.app).registry
    lease, served, metrics = await acquire(request, req.model, req.keep_alive)
    handed_off = False
    try:
        prompts, texts, requests, settings = await serving.off_loop(
            served, _plan, req, lease, served, app_state(request.app).config.limits)
        if req.stream and len(requests) > 1:
            raise invalid_request("stream takes one prompt; send several prompts without stream",
                                  "prompt")
        if req.n_predict == 0:
            results = [_only_fields(_evaluated_only(i, ids, req, settings, texts[i], served.n_ctx),
                                    req.response_fields) for i, ids in enumerate(prompts)]
            return JSONResponse(results[0] if len(results) == 1 else results)
        plan = serving.Plan(requests, sum(len(ids) for ids in prompts))
        plan.observe(metrics)
        plan.submit(served)  # a full queue is a 503 here, before any header goes out
        if req.stream:
            def close() -> None:
                plan.cancel()
                registry.release(lease)

            chunks = _stream(plan, req, settings, texts[0], served.n_ctx)  # dicts: sse() takes them
            response = EventStreamResponse(chunks, on_close=close)  # type: ignore[arg-type]
            handed_off = True
            return response
        try:
            done = await cancel_on_disconnect(request, asyncio.gather(
                *(_collect(g) for g in plan.submitted)))
        finally:
            plan.cancel()
        results = [_only_fields(_final(i, text, [t.token for t in tokens], tokens, fin, req,
                                       settings, texts[i], served.n_ctx, streamed=False),
                                req.response_fields)
                   for i, (text, tokens, fin) in enumerate(done)]
        return JSONResponse(results[0] if len(results) == 1 else results)
    finally:
        if not handed_off:
            registry.release(lease)


# --------------------------------------------------------------------------------- tokens, template

async def _with_model(request: Request, model: str | None) -> tuple[Lease, GenerativeModel]:
    lease, served, _ = await acquire(request, model)  # no generation: nothing to observe
    return lease, served


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
        text = await serving.off_loop(
            served, partial(served.chat_template.render, add_generation_prompt=True,
                            time_budget=limits.template_timeout, max_chars=limits.max_prompt),
            [m.for_template() for m in req.messages])
        return JSONResponse({"prompt": text})
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
        "model_path": str(entry.model),
        "model_alias": entry.name,
        "chat_template": template or "",
        "chat_template_caps": {},
        "modalities": {"vision": False, "audio": False},
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
    "GET /props": props,
    "GET /slots": slots,
    "GET /v1/health": admin.health,
    "POST /models/load": load_model,
    "POST /models/unload": unload_model,
}


def routes() -> list[BaseRoute]:
    return endpoints.routes(ENDPOINTS)
