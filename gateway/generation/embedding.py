"""Embedding and rerank requests on a model: inputs -> token ids -> pooled outputs, every input
of a request submitted at once so the scheduler runs them in the same forward passes (an
encoder: all its texts in one; a decoder: one slot each, beside the generations).

    OpenAI /v1/embeddings  texts or token ids -> L2-normalised vectors (llama.cpp's
                           --embd-normalize 2), `dimensions` by truncation then renormalising
                           (Matryoshka-trained models), float or base64
    llama.cpp /embedding   content -> [{index, embedding: [[...]]}]: one normalised row, or
                           with pooling none every token's raw vector
    rerank                 (query, document) pairs built as llama-server builds them
                           (engine.rerank) -> the rank head's first score (a raw logit, or
                           Qwen3-Reranker's P(yes)), best first, top_n of them

Texts are tokenized as llama-server tokenizes embedding inputs: special tokens added (BOS or
[CLS], and EOS or [SEP] where the vocabulary appends one: Qwen3-Embedding's end token) and
parsed. What a model is for (GenerativeModel.role) decides what it answers: a reranker only
ranks, and pooling none has no OpenAI shape (llama-server's answers to both, as 400s).
"""
from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.pooling import normalize
from gateway import protocol as p
from gateway.config import LimitSettings
from gateway.errors import context_length_exceeded, invalid_request
from gateway.generation.model import GenerativeModel
from gateway.generation.serving import check_prompt_size, off_loop
from gateway.metrics import RequestMetrics
from gateway.protocol import rerank as r

IN_FLIGHT = 32  # a request's inputs in the model's queue at once (an encoder's batch: 32 texts)


def embedding_ids(served: GenerativeModel, text: str, limits: LimitSettings, param: str) -> list[int]:
    """An embedding input's tokens (special tokens added and parsed, as llama-server)."""
    check_prompt_size(served, text, limits, param)
    return list(served.tokenizer.encode(text, add_special=True, parse_special=True))


def _checked(served: GenerativeModel, ids: list[int], param: str) -> list[int]:
    if not ids:
        raise invalid_request(f"{param} is empty after tokenizing", param)
    if any(not 0 <= t < served.n_vocab for t in ids):
        raise invalid_request(f"{param} token ids must be in 0..{served.n_vocab - 1}", param)
    if len(ids) > served.n_ctx:
        raise context_length_exceeded(len(ids), served.n_ctx, param)
    return ids


def _mixed_ids(served: GenerativeModel, parts: Sequence[int | str], limits: LimitSettings,
               param: str) -> list[int]:
    """Ids and texts in one sequence, as llama-server's `tokenize_mixed`: a text is tokenized
    with special tokens added only when it opens the sequence."""
    ids: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            check_prompt_size(served, part, limits, param)
            ids += served.tokenizer.encode(part, add_special=i == 0, parse_special=True)
        else:
            ids.append(part)
    return ids


def _inputs(served: GenerativeModel, items: Sequence[str | Sequence[int | str]],
            limits: LimitSettings, param: str) -> list[list[int]]:
    return [_checked(served, embedding_ids(served, item, limits, param) if isinstance(item, str)
                     else _mixed_ids(served, item, limits, param), param) for item in items]


async def _pooled_all(served: GenerativeModel, prompts: list[list[int]],
                      metrics: RequestMetrics | None) -> list[np.ndarray]:
    """The prompts submitted together, up to IN_FLIGHT at once (a batch for the scheduler; a
    request of 256 inputs neither fills the model's queue nor waits for one at a time); the
    others are cancelled, freeing their slots, when one fails."""
    window = asyncio.Semaphore(IN_FLIGHT)

    async def one(ids: list[int]) -> np.ndarray:
        async with window:
            return await served.embed(ids)

    tasks = [asyncio.ensure_future(one(ids)) for ids in prompts]
    try:
        out = await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        raise
    if metrics is not None:
        for ids in prompts:
            metrics.embedded(len(ids))
    return list(out)


def _wants_vectors(served: GenerativeModel, alias: str, oai: bool) -> None:
    if served.role == "rerank":
        raise invalid_request(f"{alias} is a reranker: it scores query and document pairs at "
                              "/v1/rerank and makes no embeddings", "model")
    if oai and served.pooling == "none":
        raise invalid_request("Pooling type 'none' is not OAI compatible: use /embedding, or an "
                              "entry with another pooling", "model")


async def embeddings(served: GenerativeModel, alias: str, req: p.EmbeddingRequest,
                     limits: LimitSettings, metrics: RequestMetrics | None = None
                     ) -> p.EmbeddingList:
    """OpenAI's /v1/embeddings on a local model."""
    _wants_vectors(served, alias, oai=True)
    n_embd = served.n_embd
    if req.dimensions is not None and req.dimensions > n_embd:
        raise invalid_request(f"dimensions is {req.dimensions}, but this model's embeddings "
                              f"have {n_embd}", "dimensions")
    prompts = await off_loop(served, _inputs, served, req.inputs(), limits, "input")
    vectors = await _pooled_all(served, prompts, metrics)
    data = []
    for index, raw in enumerate(vectors):
        vector = normalize(raw)
        if req.dimensions is not None and req.dimensions < n_embd:
            vector = normalize(vector[:req.dimensions])  # a Matryoshka prefix, unit again
        value: list[float] | str
        if req.encoding_format == "base64":
            value = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
        else:
            value = vector.tolist()
        data.append(p.Embedding(index=index, embedding=value))
    total = sum(len(ids) for ids in prompts)
    return p.EmbeddingList(data=data, model=alias,
                           usage=p.EmbeddingUsage(prompt_tokens=total, total_tokens=total))


async def llama_embeddings(served: GenerativeModel, alias: str,
                           items: Sequence[str | list[int]], normalize_kind: int,
                           limits: LimitSettings, metrics: RequestMetrics | None = None
                           ) -> list[dict[str, Any]]:
    """llama.cpp's /embedding: [{index, embedding: rows}], one row per text (normalised unless
    embd_normalize is -1) or, with pooling none, every token's raw row."""
    _wants_vectors(served, alias, oai=False)
    if normalize_kind not in (-1, 2):
        raise invalid_request("embd_normalize must be -1 (none) or 2 (Euclidean) here",
                              "embd_normalize")
    prompts = await off_loop(served, _inputs, served, items, limits, "content")
    out = []
    for index, pooled in enumerate(await _pooled_all(served, prompts, metrics)):
        rows = pooled if pooled.ndim == 2 else (
            normalize(pooled) if normalize_kind == 2 else pooled)[None, :]
        out.append({"index": index, "embedding": rows.tolist()})
    return out


def _pairs(served: GenerativeModel, query: str, documents: list[str],
           limits: LimitSettings) -> list[list[int]]:
    out = []
    for i, doc in enumerate(documents):
        check_prompt_size(served, query + doc, limits, f"documents[{i}]")
        out.append(_checked(served, served.rerank_prompt(query, doc), f"documents[{i}]"))
    return out


async def rerank(served: GenerativeModel, alias: str, req: r.RerankRequest,
                 limits: LimitSettings, metrics: RequestMetrics | None = None) -> r.RerankResponse:
    """Each document's score for the query; the best first, top_n of them."""
    if served.role != "rerank":
        raise invalid_request(f"{alias} is not a reranker (it has no rank pooling: a classifier "
                              "head and `pooling: rank`)", "model")
    texts = req.texts()
    prompts = await off_loop(served, _pairs, served, req.query, texts, limits)
    scores = [float(s[0]) for s in await _pooled_all(served, prompts, metrics)]
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[:req.top_n or len(texts)]
    results = [r.RerankResult(index=i, relevance_score=scores[i],
                              document=r.DocumentText(text=texts[i]) if req.return_documents
                              else None) for i in order]
    total = sum(len(ids) for ids in prompts)
    return r.RerankResponse(id=f"rerank-{uuid.uuid4().hex}", model=alias, results=results,
                            usage=r.RerankUsage(prompt_tokens=total, total_tokens=total))

