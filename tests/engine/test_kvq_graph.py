"""A quantized KV cache on the fused graph (engine.kernels.kvq_tasks): the compiled row
quantizers store the bytes of their numpy twin (engine.kv_types.quantize_rows), and the fused
pass gives the eager pass's bits, outputs and cache rows, for q8_0, q4_0 and a mixed pair, at
any thread count and batch."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import engine
from engine.kernels.kvq_tasks import load_kvq_tasks
from engine.kv_types import KV_TYPES, quantize_rows
from engine.model import Chunk
from tests.support.ggufgen import write_tiny_llama
from tests.support.step_checks import fused_and_eager

PROMPT = "hello world, the quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_compiled_row_quantizer_stores_the_twins_bytes(kv: str) -> None:
    t = KV_TYPES[kv]
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(32 * 12) * rng.choice([1e-3, 1.0, 40.0], 32 * 12)).astype(np.float32)
    x[32:64] = 0.0                                   # a zero block
    x[64:96] = np.float32(0.5)                       # every value the largest
    x[96:128] = rng.integers(-3, 4, 32).astype(np.float32) / 2  # few distinct values
    x[128 + 5], x[128 + 9] = 7.0, -7.0               # the first of two equal magnitudes
    ours = load_kvq_tasks().quantize(x, kv, t.row_bytes(x.size))
    np.testing.assert_array_equal(ours, quantize_rows(x, t))


def _tiny(tmp: Path, n_embd: int, n_head: int, n_head_kv: int) -> Path:
    return write_tiny_llama(tmp / "tiny.gguf", n_layer=2, qtype=Q.Q8_0, n_embd=n_embd,
                            n_head=n_head, n_head_kv=n_head_kv, n_ff=2 * n_embd)


SHAPES = {"hd64-group2": (256, 4, 2), "hd32-group4": (256, 8, 2), "hd128-group1": (256, 2, 2)}


@pytest.fixture(scope="module", params=list(SHAPES))
def tiny_path(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory.mktemp(request.param), *SHAPES[request.param])


@pytest.mark.parametrize("kv", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0")])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_fused_quantized_pass_equals_eager_pass(tiny_path: Path, kv: tuple[str, str],
                                                n_threads: int) -> None:
    with engine.load(tiny_path, n_ctx=160, n_threads=n_threads, n_slots=6, type_k=kv[0],
                     type_v=kv[1]) as model:
        model.transformer.governor.choose = lambda kind: n_threads  # every run on all threads
        ids = model.tokenizer.encode(PROMPT)
        long = (ids * 8)[:70]
        fused_and_eager(model, [
            ([Chunk(0, ids, 0)], "all"),
            ([Chunk(0, [7], len(ids))], "last"),                     # decode
            ([Chunk(1, long, 0), Chunk(0, [9], len(ids) + 1)], "last"),  # prefill beside decode
            ([Chunk(0, [3], len(ids) + 2), Chunk(1, [4], 70), Chunk(2, ids[:5], 0)], "last"),
            ([Chunk(2, [11, 12], 3)], "hidden"),                     # rewrite a slot's tail
            ([Chunk(1, ids, 71)], "all"),
        ])


def test_a_quantized_cache_runs_the_fused_graph(tmp_path: Path) -> None:
    with engine.load(_tiny(tmp_path, 256, 4, 2), n_ctx=64, n_threads=2, type_k="q8_0",
                     type_v="q8_0") as model:
        tr = model.transformer

        def eager(*args: object, **kw: object) -> list[np.ndarray]:
            raise AssertionError("forward went op by op")

        tr.forward_eager = eager  # type: ignore[method-assign]
        ids = model.tokenizer.encode(PROMPT)
        first = tr.forward([Chunk(0, ids, 0)], "last")[0]
        step = tr.forward([Chunk(0, [int(first.argmax())], len(ids))], "last")[0]
        assert np.isfinite(step).all() and len(tr.cache.tokens[0]) == len(ids) + 1
