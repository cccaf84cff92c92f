"""Embedding and rerank models served (#32): OpenAI's /v1/embeddings through the official client
and LangChain's OpenAIEmbeddings, llama.cpp's /embedding, /v1/rerank (Cohere's and Jina's shape,
with httpx), chat refused, /v1/models and Ollama's /api/show. The expected vectors and scores are
llama.cpp's (tests/data/encoders), normalised by numpy here."""
from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.support.refs import ENCODERS_DIR

MANIFEST = {e["file"]: e for e in json.loads((ENCODERS_DIR / "manifest.json").read_text())["models"]}
BERT = "bert_d64_l2_mean_f32.gguf"
QWEN3_EMB = "qwen3_emb_d64_last_f32.gguf"
BERT_RANK = "bert_rerank_d64_l2_f32.gguf"
QWEN3_RANK = "qwen3_rerank_d64_f32.gguf"


def _ref(name: str) -> Any:
    return np.load(ENCODERS_DIR / MANIFEST[name]["npz"])


def _unit(v: np.ndarray) -> np.ndarray:
    v64 = v.astype(np.float64)
    return v64 / np.linalg.norm(v64, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def server(module_apps: Any) -> Any:
    models = [
        {"aliases": ["bge"], "model": str(ENCODERS_DIR / BERT), "n_ctx": 512, "n_threads": 1},
        {"aliases": ["bge-tokens"], "model": str(ENCODERS_DIR / BERT), "n_ctx": 512,
         "n_threads": 1, "pooling": "none"},
        {"aliases": ["qwen3-emb"], "model": str(ENCODERS_DIR / QWEN3_EMB), "n_ctx": 512,
         "n_threads": 1, "flash_attn": False},
        {"aliases": ["bge-reranker"], "model": str(ENCODERS_DIR / BERT_RANK), "n_ctx": 512,
         "n_threads": 1},
        {"aliases": ["qwen3-reranker"], "model": str(ENCODERS_DIR / QWEN3_RANK), "n_ctx": 1024,
         "n_threads": 1, "flash_attn": False},
    ]
    return module_apps.serve({"models": models})


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.mark.parametrize(("alias", "name"), [("bge", BERT), ("qwen3-emb", QWEN3_EMB)])
def test_openai_embeddings_create_gives_llama_cpps_unit_vectors(
        client: openai.OpenAI, alias: str, name: str) -> None:
    entry = MANIFEST[name]
    texts = entry["texts"][1:7]
    reply = client.embeddings.create(model=alias, input=texts)
    got = np.array([d.embedding for d in reply.data])
    assert [d.index for d in reply.data] == list(range(len(texts)))
    want = _unit(_ref(name)["embd"][1:7])
    assert np.abs(got - want).max() <= entry["suggested_tolerance"]["normalized_max_abs"]
    assert reply.usage.prompt_tokens == sum(entry["n_ids"][1:7])


def test_token_id_inputs_base64_and_dimensions(client: openai.OpenAI) -> None:
    ref, entry = _ref(BERT), MANIFEST[BERT]
    ids = [int(t) for t in ref["ids"][2][:ref["n_ids"][2]]]  # already [CLS] ... [SEP]
    by_ids = client.embeddings.create(model="bge", input=[ids])
    tol = entry["suggested_tolerance"]["normalized_max_abs"]
    assert np.abs(np.array(by_ids.data[0].embedding) - _unit(ref["embd"][2])).max() <= tol
    raw = httpx.post(str(client.base_url) + "embeddings", timeout=30, json={
        "model": "bge", "input": entry["texts"][2], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    assert np.abs(decoded - _unit(ref["embd"][2])).max() <= tol
    short = client.embeddings.create(model="bge", input=entry["texts"][2], dimensions=16)
    assert np.allclose(short.data[0].embedding, _unit(ref["embd"][2][:16]), atol=4 * tol)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="bge", input="x", dimensions=65)


def test_llama_server_input_shapes_give_llama_cpps_vectors(server: Any) -> None:
    """llama-server's `input` extensions (server-common.cpp tokenize_input_prompts): ids and
    texts mixed in one sequence (a text adds special tokens only when it opens it), prompt
    objects and text parts; each vector is llama.cpp's for the same tokens."""
    ref, entry = _ref(BERT), MANIFEST[BERT]
    ids = [int(t) for t in ref["ids"][2][:ref["n_ids"][2]]]  # [CLS] ... [SEP]
    text = entry["texts"][2]
    words = text.split(" ")
    inputs = [
        [ids[0], text, ids[-1]],                        # one sequence: [CLS] text [SEP]
        {"prompt_string": text},
        {"content": [{"type": "text", "text": words[0] + " "},
                     {"type": "text", "text": " ".join(words[1:])}]},
        [text, *ids[1:0]],                              # a leading text gets [CLS] ... [SEP]
    ]
    reply = httpx.post(server.url + "/v1/embeddings", timeout=30,
                       json={"model": "bge", "input": inputs})
    assert reply.status_code == 200, reply.text
    got = np.array([d["embedding"] for d in reply.json()["data"]])
    assert got.shape[0] == 4
    tol = entry["suggested_tolerance"]["normalized_max_abs"]
    assert np.abs(got - _unit(ref["embd"][2])).max() <= tol
    one = httpx.post(server.url + "/v1/embeddings", timeout=30,
                     json={"model": "bge", "input": [ids[0], text, ids[-1]]}).json()
    assert len(one["data"]) == 1 and one["usage"]["prompt_tokens"] == len(ids)
    for bad in ([], {"content": "text"}, {"content": [{"type": "unknown"}]},
                {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}):
        refused = httpx.post(server.url + "/v1/embeddings", timeout=30,
                             json={"model": "bge", "input": bad})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "input"


def test_langchain_openai_embeddings_work_unchanged(server: Any) -> None:
    from langchain_openai import OpenAIEmbeddings

    emb = OpenAIEmbeddings(model="bge", base_url=server.url + "/v1", api_key="none",
                           check_embedding_ctx_length=False)
    entry, ref = MANIFEST[BERT], _ref(BERT)
    docs = emb.embed_documents(entry["texts"][1:4])
    query = emb.embed_query(entry["texts"][4])
    tol = entry["suggested_tolerance"]["normalized_max_abs"]
    assert np.abs(np.array(docs) - _unit(ref["embd"][1:4])).max() <= tol
    assert np.abs(np.array(query) - _unit(ref["embd"][4])).max() <= tol


def test_llama_cpp_embedding_and_pooling_none(server: Any) -> None:
    ref, entry = _ref(BERT), MANIFEST[BERT]
    text = entry["texts"][MANIFEST[BERT]["tok_text_index"]]
    rows = httpx.post(server.url + "/embedding", timeout=30,
                      json={"model": "bge-tokens", "content": text}).json()
    tokens = np.array(rows[0]["embedding"])
    assert tokens.shape == ref["tok_embd"].shape  # every token's raw vector
    assert np.abs(tokens - ref["tok_embd"]).max() <= 2 * entry["suggested_tolerance"]["raw_max_abs"]
    pooled = httpx.post(server.url + "/embeddings", timeout=30,
                        json={"model": "bge", "content": [text, entry["texts"][1]]}).json()
    assert [r["index"] for r in pooled] == [0, 1]
    got = np.array([r["embedding"][0] for r in pooled])
    tol = entry["suggested_tolerance"]["normalized_max_abs"]
    assert np.abs(got - _unit(ref["embd"][[2, 1]])).max() <= tol
    raw = httpx.post(server.url + "/embedding", timeout=30, json={
        "model": "bge", "content": text, "embd_normalize": -1}).json()
    assert np.abs(np.array(raw[0]["embedding"][0]) - ref["embd"][2]).max() \
        <= entry["suggested_tolerance"]["raw_max_abs"]
    no_oai = httpx.post(server.url + "/v1/embeddings", timeout=30,
                        json={"model": "bge-tokens", "input": text})
    assert no_oai.status_code == 400 and "not OAI compatible" in no_oai.text


@pytest.mark.parametrize(("alias", "name"), [("bge-reranker", BERT_RANK),
                                             ("qwen3-reranker", QWEN3_RANK)])
def test_rerank_in_cohere_shape_orders_llama_cpps_scores(server: Any, alias: str, name: str) -> None:
    entry, ref = MANIFEST[name], _ref(name)
    pairs = entry["pairs"][:4]  # two queries, two documents each
    query = pairs[0]["query"]
    docs = [p["document"] for p in pairs[:2]]
    r = httpx.post(server.url + "/v1/rerank", timeout=60, json={
        "model": alias, "query": query, "documents": docs, "top_n": 2, "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    want = ref["scores"][:2, 0]
    order = [int(i) for i in np.argsort(-want)]
    assert [x["index"] for x in body["results"]] == order
    assert [x["document"]["text"] for x in body["results"]] == [docs[i] for i in order]
    got = np.array([x["relevance_score"] for x in body["results"]])
    assert np.abs(got - want[order]).max() <= entry["suggested_tolerance"]["score_max_abs"]
    n_tokens = sum(len(p["ids"]) for p in pairs[:2])
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    top = httpx.post(server.url + "/rerank", timeout=60, json={
        "model": alias, "query": query, "documents": [{"text": d} for d in docs], "top_n": 1})
    assert [x["index"] for x in top.json()["results"]] == order[:1]
    assert "document" not in top.json()["results"][0]


def test_many_documents_rerank_together(server: Any) -> None:
    """Every document of a request is submitted at once: 40 documents (more than the slots)
    come back, each scored as when it is ranked alone."""
    entry = MANIFEST[BERT_RANK]
    docs = [p["document"] for p in entry["pairs"]] * 7
    query = entry["pairs"][0]["query"]
    many = httpx.post(server.url + "/v1/reranking", timeout=60, json={
        "model": "bge-reranker", "query": query, "documents": docs}).json()["results"]
    assert sorted(x["index"] for x in many) == list(range(len(docs)))
    alone = {}
    for i, d in enumerate(docs[:6]):
        one = httpx.post(server.url + "/v1/rerank", timeout=60, json={
            "model": "bge-reranker", "query": query, "documents": [d]}).json()
        alone[i] = one["results"][0]["relevance_score"]
    for x in many:
        assert abs(x["relevance_score"] - alone[x["index"] % 6]) <= 1e-4


def test_chat_on_an_embedding_model_is_a_400_saying_so(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="bge is an embedding model"):
        client.chat.completions.create(model="bge", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="reranking model"):
        client.completions.create(model="bge-reranker", prompt="hi")


def test_a_reranker_makes_no_embeddings_and_an_embedder_does_not_rank(
        client: openai.OpenAI, server: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="reranker"):
        client.embeddings.create(model="bge-reranker", input="hi")
    r = httpx.post(server.url + "/v1/rerank", timeout=30,
                   json={"model": "bge", "query": "q", "documents": ["d"]})
    assert r.status_code == 400 and "not a reranker" in r.text
    r = httpx.post(server.url + "/v1/rerank", timeout=30,
                   json={"model": "bge-reranker", "query": "q", "documents": []})
    assert r.status_code == 400 and "documents" in r.text


def test_models_and_ollama_show_say_what_each_model_is(server: Any) -> None:
    cards = {c["id"]: c for c in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]}
    assert cards["bge"]["modelyard"]["capabilities"] == ["embedding"]
    assert cards["qwen3-emb"]["modelyard"]["capabilities"] == ["embedding"]
    assert cards["bge-reranker"]["modelyard"]["capabilities"] == ["rerank"]
    show = httpx.post(server.url + "/api/show", timeout=30, json={"model": "bge"}).json()
    assert show["capabilities"] == ["embedding"]
    show = httpx.post(server.url + "/api/show", timeout=30, json={"model": "qwen3-reranker"}).json()
    assert show["capabilities"] == ["rerank"]


@pytest.mark.parametrize(("name", "role"), [(BERT, "embedding"), (QWEN3_EMB, "embedding"),
                                            (BERT_RANK, "rerank"), (QWEN3_RANK, "rerank")])
def test_scan_marks_embedding_and_rerank_models(tmp_path: Any, name: str, role: str) -> None:
    from gateway import scan

    path = tmp_path / "bge-small-en-v1.5-q8_0.gguf"
    path.write_bytes((ENCODERS_DIR / name).read_bytes())
    found = scan.examine_file(path)
    assert not isinstance(found, scan.Skipped), found
    assert found.role == role
    assert f"{role} model" in found.summary() and "chat template" not in found.summary()


def test_a_request_of_more_inputs_than_the_queue_holds(client: openai.OpenAI) -> None:
    """203 inputs (more than 32 slots and a queue of 64) are served, not refused as busy."""
    entry = MANIFEST[BERT]
    texts = entry["texts"][1:] * 29  # 203 ("" is refused by OpenAI's protocol)
    reply = client.embeddings.create(model="bge", input=texts)
    got = np.array([d.embedding for d in reply.data])
    want = _unit(_ref(BERT)["embd"][1:])
    assert np.abs(got - np.tile(want, (29, 1))).max() <= entry["suggested_tolerance"]["normalized_max_abs"]
