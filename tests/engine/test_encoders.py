"""Embedding and reranking models against llama.cpp (tests/data/encoders, README there): bert and
nomic-bert encoders, a qwen3 last-token embedder, a BERT cross-encoder and a qwen3 yes/no
reranker. Token ids equal llama.cpp's; pooled vectors, per-token states and rank scores are
within the manifest's tolerances, batched and one by one."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import engine
from engine.batch import BatchRunner, Embedding, Sequence
from engine.encoder import gelu_f16, gelu_f32
from engine.kernels import amx_gemm
from engine.pooling import normalize
from engine.rerank import rerank_ids
from engine.sampling import SamplingParams
from tests.support.batch_checks import run_all
from tests.support.refs import ENCODERS_DIR as ENC_DIR

# the FMA panel GEMM everywhere; AMX tiles too (F16 projections) where the CPU has them
MODES = [False] + ([True] if amx_gemm.available() else [])
IDS = ["fma", "amx"][:len(MODES)]
MANIFEST = json.loads((ENC_DIR / "manifest.json").read_text())
MODELS = {e["file"]: e for e in MANIFEST["models"]}
EMBEDDERS = [f for f, e in MODELS.items() if e["role"] == "embedding"]
RERANKERS = [f for f, e in MODELS.items() if e["role"] == "reranker"]


def _load(name: str, **kw: Any) -> engine.Model:
    # the references ran without flash attention (manifest "settings"), so the decoders' numerics
    # follow llama.cpp's plain attention path; rerank prompts of 185-225 tokens want room
    return engine.load(ENC_DIR / name, n_ctx=2048 if "qwen3_rerank" in name else 512,
                       n_threads=1, n_slots=8, flash_attn=False, **kw)


def _rows(ids: np.ndarray, n: np.ndarray) -> list[list[int]]:
    return [[int(t) for t in ids[i][:n[i]]] for i in range(len(n))]


def _within(got: np.ndarray, want: np.ndarray, max_abs: float, cos_min: float | None = None) -> None:
    diff = float(np.abs(got - want).max())
    assert diff <= max_abs, f"max abs {diff} > {max_abs}"
    if cos_min is not None:
        g, w = got.astype(np.float64), want.astype(np.float64)
        cos = (g * w).sum(-1) / np.linalg.norm(g, axis=-1) / np.linalg.norm(w, axis=-1)
        assert float(cos.min()) >= cos_min, f"cosine {cos.min()} < {cos_min}"


@pytest.fixture(scope="module", params=sorted(MODELS))
def loaded(request: pytest.FixtureRequest) -> Any:
    name = request.param
    model = _load(name)
    yield name, model, np.load(ENC_DIR / MODELS[name]["npz"])
    model.close()


def test_token_ids_equal_llama_cpp(loaded: Any) -> None:
    name, model, _ = loaded
    entry = MODELS[name]
    if "texts" in entry:
        for text, ids in zip(entry["texts"], entry["ids"]):
            assert model.tokenizer.encode(text, add_special=True) == ids, text
    for pair in entry.get("pairs", []):
        assert rerank_ids(model.tokenizer, model.metadata, pair["query"], pair["document"]) \
            == pair["ids"], pair


def test_vocab_facts_as_llama_cpp(loaded: Any) -> None:
    name, model, _ = loaded
    meta, tok = MODELS[name]["llama_meta"], model.tokenizer
    assert (tok.bos_id if tok.bos_id is not None else -1) == meta["bos_id"] or not meta["add_bos"]
    assert (tok.add_bos, tok.add_eos, tok.add_sep) == (meta["add_bos"], meta["add_eos"], meta["add_sep"])
    if meta["sep_id"] >= 0:
        assert tok.sep_id == meta["sep_id"]


@pytest.mark.parametrize("amx", MODES, ids=IDS)
@pytest.mark.parametrize("name", EMBEDDERS)
def test_pooled_embeddings_within_tolerance_batched_and_single(name: str, amx: bool) -> None:
    entry, ref = MODELS[name], np.load(ENC_DIR / MODELS[name]["npz"])
    tol = entry["suggested_tolerance"]
    texts = _rows(ref["ids"], ref["n_ids"])
    with _load(name, amx=amx) as model:
        assert model.pooling == entry["hparams"]["pooling_type"].lower()
        batched = np.stack(model.pooled_many(texts))
        single = np.stack([model.pooled(t) for t in texts])
        embedded = np.stack([model.embed(t) for t in texts])
    _within(batched, ref["embd"], tol["raw_max_abs"], tol["cosine_min"])
    _within(single, ref["embd_single"], tol["raw_max_abs"], tol["cosine_min"])
    _within(embedded, ref["embd_normalized"], tol["normalized_max_abs"], tol["cosine_min"])


@pytest.mark.parametrize("name", EMBEDDERS)
def test_pooling_none_gives_llama_cpps_token_states(name: str) -> None:
    entry, ref = MODELS[name], np.load(ENC_DIR / MODELS[name]["npz"])
    with _load(name, pooling="none") as model:
        states = model.pooled([int(t) for t in ref["tok_embd_ids"]])
    assert states.shape == ref["tok_embd"].shape
    # per-token states: the raw tolerance, scaled as the manifest's pooled-vs-token check allows
    _within(states, ref["tok_embd"], 2 * entry["suggested_tolerance"]["raw_max_abs"])


def test_the_entry_pooling_overrides_the_file() -> None:
    """The mean file pooled by CLS is llama.cpp's CLS file (same weights, only the key differs;
    llama.cpp's own override gave the CLS file's vectors bit for bit)."""
    cls = MODELS["bert_d64_l2_cls_f32.gguf"]
    ref = np.load(ENC_DIR / cls["npz"])
    with _load("bert_d64_l2_mean_f32.gguf", pooling="cls") as model:
        got = np.stack(model.pooled_many(_rows(ref["ids"], ref["n_ids"])))
    _within(got, ref["embd"], cls["suggested_tolerance"]["raw_max_abs"])


@pytest.mark.parametrize("amx", MODES, ids=IDS)
@pytest.mark.parametrize("name", RERANKERS)
def test_rerank_scores_within_tolerance_batched_and_single(name: str, amx: bool) -> None:
    entry, ref = MODELS[name], np.load(ENC_DIR / MODELS[name]["npz"])
    tol = entry["suggested_tolerance"]["score_max_abs"]
    pairs = _rows(ref["pair_ids"], ref["n_pair_ids"])
    with _load(name, amx=amx) as model:
        assert model.is_reranker
        batched = np.stack(model.pooled_many(pairs))
        single = np.stack([model.pooled(p) for p in pairs])
    _within(batched, ref["scores"], tol)
    _within(single, ref["scores_single"], tol)


def test_rank_pooling_needs_a_classifier() -> None:
    with pytest.raises(engine.ModelLoadError, match="classifier"):
        _load("bert_d64_l2_mean_f32.gguf", pooling="rank")


def test_an_encoder_does_not_generate() -> None:
    with _load("bert_d64_l2_mean_f32.gguf") as model, pytest.raises(ValueError, match="embeds"):
        list(model.generate([2, 3], max_tokens=1))


def test_gelu_follows_ggmls_f16_table() -> None:
    """The table's values are gelu at f16 inputs rounded to f16: within f16 rounding of the
    exact tanh GELU in float64 (plus float32's cancellation in 1 + tanh, which ggml's float
    formula has too: |x| ulp(1) / 2 for negative x), and the ends as ggml's (0 below -10, x
    above 10)."""
    x = np.linspace(-12, 12, 20001, dtype=np.float32)
    got = gelu_f16(x)
    x16 = x.astype(np.float16).astype(np.float64)
    exact = 0.5 * x16 * (1 + np.tanh(np.sqrt(2 / np.pi) * x16 * (1 + 0.044715 * x16 * x16)))
    inside = np.abs(x) < 10
    bound = np.abs(exact[inside]) * 2 ** -10 + np.abs(x[inside]) * 2.0 ** -24
    assert np.all(np.abs(got[inside] - exact[inside]) <= bound)
    assert np.all(got[x <= -10] == 0) and np.array_equal(got[x >= 10], x[x >= 10])
    assert np.allclose(gelu_f32(x[inside]), exact[inside], atol=2e-2)


def test_normalize_is_llama_cpps_l2() -> None:
    v = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    assert np.array_equal(normalize(v), np.array([[0.6, 0.8], [0.0, 0.0]], np.float32))


@pytest.mark.parametrize("name", ["bert_d64_l2_mean_f32.gguf", "qwen3_emb_d64_last_f32.gguf",
                                  "bert_rerank_d64_l2_f32.gguf"])
def test_the_batch_runner_pools_as_the_model(name: str) -> None:
    """Texts submitted together to the server's batch runner (an encoder's all in one forward
    call, whole) pool to llama.cpp's batched vectors or scores."""
    entry, ref = MODELS[name], np.load(ENC_DIR / MODELS[name]["npz"])
    rerank = entry["role"] == "reranker"
    texts = _rows(ref["pair_ids"], ref["n_pair_ids"]) if rerank else _rows(ref["ids"], ref["n_ids"])
    with _load(name) as model:
        runner = BatchRunner(model, prefill_budget=16)
        jobs = [Embedding(t) for t in texts]
        for job in jobs:
            runner.submit(job)
        steps = run_all(runner)
        runner.close()
    if model.is_encoder:
        assert steps == 1  # every text in one forward call, whatever the prefill budget
    got = np.stack([j.vector for j in jobs])
    tol = entry["suggested_tolerance"]
    _within(got, ref["scores" if rerank else "embd"],
            tol["score_max_abs"] if rerank else tol["raw_max_abs"])


def test_embeddings_batch_beside_a_generation_without_starving_it() -> None:
    """A decoding sequence gets its token in every step while a crowd of long embedding inputs
    is read alongside (their chunks share the step's prefill budget), and the embeddings come
    out as the model pools them alone."""
    name = "qwen3_emb_d64_last_f32.gguf"
    ref = np.load(ENC_DIR / MODELS[name]["npz"])
    texts = _rows(ref["ids"], ref["n_ids"])
    with _load(name) as model:
        alone = [model.pooled(t) for t in texts]
        runner = BatchRunner(model, prefill_budget=32)
        seq = Sequence(texts[2], params=SamplingParams(temperature=0.0), max_tokens=24,
                       stop_at_eog=False)
        runner.submit(seq)
        runner.step()                                            # its prompt read, one token
        jobs = [Embedding(t) for t in texts[1:]]
        for job in jobs:
            runner.submit(job)
        steps = 0
        while not all(j.vector is not None for j in jobs):
            before = len(seq.generated)
            runner.step()
            steps += 1
            assert len(seq.generated) == before + 1              # never a step without its token
        assert steps >= 4  # the inputs (250 tokens, the budget 32 a step) took several steps
        run_all(runner)
        runner.close()
    for job, want in zip(jobs, alone[1:]):
        assert np.array_equal(job.vector, want) or np.abs(job.vector - want).max() < 1e-5


@pytest.mark.parametrize("amx", MODES, ids=IDS)
def test_f16_weights_give_llama_cpps_vectors(amx: bool) -> None:
    """An F16 encoder (its weights packed as F16 for the panel GEMM, no float32 copies, or as
    two bf16 halves for the AMX tiles; inputs rounded to f16 as ggml does) against llama.cpp's
    vectors for the same file (made here, README)."""
    ref = np.load(ENC_DIR / "bert_d64_l2_mean_f16.npz")
    texts = _rows(ref["ids"], ref["n_ids"])
    tol = MODELS["bert_d64_l2_mean_f32.gguf"]["suggested_tolerance"]
    path = ENC_DIR / "bert_d64_l2_mean_f16.gguf"
    with _load(path.name, amx=amx) as model:
        layers = model.transformer.weights.layers
        assert all(m.qtype.name == "F16" for m in layers[0].matrices())
        if amx:  # 4 bytes a weight where the file has 2; the estimate counts them alike
            halves = sum(2 * m.n_rows * m.n_cols for layer in layers for m in layer.matrices())
            assert model.transformer.repacked_bytes == halves
            assert engine.estimate_memory(path, 512, 8) == model.memory_bytes
        else:
            assert model.transformer.repacked_bytes == 0  # 64-wide panels of d64 rows: no padding
            assert model.memory_bytes < 1.1 * path.stat().st_size
        assert model.tokenizer.encode(MODELS["bert_d64_l2_mean_f32.gguf"]["texts"][3],
                                      add_special=True) == texts[3]
        batched = np.stack(model.pooled_many(texts))
        single = np.stack([model.pooled(t) for t in texts])
    _within(batched, ref["embd"], tol["raw_max_abs"], tol["cosine_min"])
    _within(single, ref["embd_single"], tol["raw_max_abs"], tol["cosine_min"])


@pytest.mark.parametrize("amx", MODES, ids=IDS)
@pytest.mark.parametrize("name", ["bert_d64_l2_mean_f32.gguf", "bert_d64_l2_mean_q8_0.gguf",
                                  "nomic_bert_d64_l2_rope_f32.gguf", "bert_d64_l2_mean_f16.gguf"])
def test_two_threads_give_the_same_vectors(name: str, amx: bool) -> None:
    """The splits (the GEMMs by weight panels, GELU and LayerNorm by token rows, attention by
    text) change no value's arithmetic: two threads give one thread's vectors bit for bit."""
    ref = np.load(ENC_DIR / MODELS.get(name, {"npz": "bert_d64_l2_mean_f16.npz"})["npz"])
    texts = _rows(ref["ids"], ref["n_ids"]) * 12  # 96 texts: every split has work
    with _load(name, amx=amx) as one:
        want = np.stack(one.pooled_many(texts))
    with engine.load(ENC_DIR / name, n_ctx=512, n_threads=2, amx=amx) as two:
        got = np.stack(two.pooled_many(texts))
    assert np.array_equal(got, want)
    tol = MODELS.get(name, MODELS["bert_d64_l2_mean_f32.gguf"])["suggested_tolerance"]
    _within(got[:8], ref["embd"], tol["raw_max_abs"])
