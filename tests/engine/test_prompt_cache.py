"""The prompt-cache pool (engine/prompt_cache/): blocks beyond the slots, in RAM and on disk.

The independent expectations: rows a slot wrote are the rows a pool hit puts back, bit for bit
(compared with the slot that computed them); greedy tokens after a pool hit are those of a cold
prefill (BatchRunner with `cache_prompt=False`, and SmolLM2's one-sequence path); a file that is
not whole, not ours or of other settings is never read back (the slot is left as a cold one).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import engine
from engine.batch import BatchRunner, Sequence
from engine.model import Chunk
from engine.prompt_cache import BLOCK, DiskStore, PromptCachePool, poolable
from engine.prompt_cache.disk import SUFFIX
from engine.sampling import SamplingParams
from tests.support.batch_checks import alone, run_all
from tests.support.ggufgen import write_tiny_llama
from tests.support.refs import SYNTH_DIR

GREEDY = SamplingParams(temperature=0.0)
N_CTX = 1200
GiB = 1 << 30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_llama(tmp_path_factory.mktemp("pool") / "tiny.gguf", qtype=Q.Q8_0,
                            n_ctx_train=2048)
    with engine.load(path, n_ctx=N_CTX, n_threads=2, n_slots=2) as model:
        yield model


@pytest.fixture(autouse=True)
def empty_slots(request):
    if "tiny" in request.fixturenames:
        cache = request.getfixturevalue("tiny").transformer.cache
        for s in range(len(cache.tokens)):
            cache.truncate(s, 0)


def ids(seed: int, n: int, vocab: int = 200) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def prefill(model, slot: int, tokens: list[int]) -> None:
    model.transformer.cache.truncate(slot, 0)
    for a in range(0, len(tokens), 128):
        model.transformer.forward([Chunk(slot, tokens[a:a + 128], a)], "last")


def rows(model, slot: int, n: int) -> list[np.ndarray]:
    c = model.transformer.cache
    return [np.array(a[slot, :, :n]) for a in (*c.k, *c.v)]


def test_a_pool_hit_puts_back_the_rows_the_slot_computed(tiny):
    system = ids(1, 600)
    prefill(tiny, 0, system + ids(2, 40))
    expected = rows(tiny, 0, 600)
    pool = PromptCachePool(tiny.transformer.cache, budget=GiB)
    pool.save(0)
    assert len(pool) == 3                          # two full blocks and the tail (640 - 512)
    found = pool.lookup(system + ids(3, 50), limit=649)
    assert found.n == 600 and found.miss == "diverged"   # the tail shares the system part only
    pool.restore(1, found)
    assert tiny.transformer.cache.tokens[1] == system
    for got, want in zip(rows(tiny, 1, 600), expected):
        np.testing.assert_array_equal(got, want)


def test_a_long_hit_is_copied_on_several_threads_row_for_row(tiny):
    # past 2 blocks the copy is split by layers over the pool's threads; the last block in part
    system = ids(4, 4 * BLOCK + 70)
    prefill(tiny, 0, system + ids(5, 20))
    expected = rows(tiny, 0, len(system))
    pool = PromptCachePool(tiny.transformer.cache, budget=GiB, threads=2)
    pool.save(0)
    found = pool.lookup(system + ids(6, 30), limit=len(system) + 30)
    assert found.n == len(system)
    for a in (*tiny.transformer.cache.k, *tiny.transformer.cache.v):
        a[1] = 0                                   # nothing left from an earlier test
    pool.restore(1, found)
    assert tiny.transformer.cache.written[1] == len(system)
    for got, want in zip(rows(tiny, 1, len(system)), expected):
        np.testing.assert_array_equal(got, want)


def test_blocks_are_shared_between_conversations(tiny):
    pool = PromptCachePool(tiny.transformer.cache, budget=GiB)
    system = ids(1, 2 * BLOCK)
    prefill(tiny, 0, system + ids(10, 300))
    pool.save(0)
    before = pool.ram_bytes
    prefill(tiny, 0, system + ids(11, 300))       # another conversation, the same system prompt
    added = pool.save(0)
    one_block = before // 4                        # 2 shared + 1 own full block + its tail
    assert pool.ram_bytes - before == added
    assert added < before - 2 * (before // 5)      # the two system blocks were not stored again
    assert len(pool) == 2 + 2 * 2 and one_block > 0


def test_the_byte_budget_drops_the_least_recently_used_first(tiny):
    cache = tiny.transformer.cache
    block_bytes = sum(a[0, :, :BLOCK].nbytes for a in (*cache.k, *cache.v))
    pool = PromptCachePool(cache, budget=3 * block_bytes)
    a, b = ids(20, 2 * BLOCK), ids(21, 2 * BLOCK)
    prefill(tiny, 0, a)
    pool.save(0)
    prefill(tiny, 0, b)
    pool.save(0)
    assert pool.ram_bytes <= 3 * block_bytes
    assert pool.lookup(b, 2 * BLOCK).n == 2 * BLOCK         # the newer prefix is whole
    miss = pool.lookup(a, 2 * BLOCK)
    # the older one lost its deepest block first (a prefix's start outlives its ends)
    assert miss.n == BLOCK and miss.miss == "evicted"
    assert pool.lookup(ids(22, 300), 300).miss == "no_entry"


def test_a_diverging_prompt_reuses_only_its_common_prefix(tiny):
    pool = PromptCachePool(tiny.transformer.cache, budget=GiB)
    runner = BatchRunner(tiny, prompt_cache=pool)
    common = ids(30, 300)
    first = Sequence(common + ids(31, 200), params=GREEDY, max_tokens=4, stop_at_eog=False)
    runner.submit(first)
    run_all(runner)
    other = Sequence(ids(32, 400), params=GREEDY, max_tokens=4, stop_at_eog=False)
    blocker = Sequence(ids(33, 400), params=GREEDY, max_tokens=4, stop_at_eog=False)
    runner.submit(other)
    runner.submit(blocker)
    run_all(runner)                                # both slots overwritten: only the pool has it
    diverging = common + ids(34, 100)
    hit = Sequence(diverging, params=GREEDY, max_tokens=6, stop_at_eog=False)
    runner.submit(hit)
    run_all(runner)
    assert hit.cached == 300 and hit.cache_miss == "diverged"
    cold = Sequence(diverging, params=GREEDY, max_tokens=6, stop_at_eog=False, cache_prompt=False)
    runner.submit(cold)
    run_all(runner)
    assert cold.cached == 0 and cold.generated == hit.generated


def test_blocks_go_to_disk_and_come_back_in_a_new_pool(tiny, tmp_path):
    cache = tiny.transformer.cache
    prompt = ids(40, 700)
    prefill(tiny, 0, prompt)
    expected = rows(tiny, 0, 700)
    store = DiskStore(tmp_path, "tiny", "fp-1", budget=GiB)
    pool = PromptCachePool(cache, budget=GiB, store=store)
    pool.close()                                   # the model unloads: slots and pool to disk
    files = list(store.folder.glob("*" + SUFFIX))
    assert len(files) == 3
    cache.truncate(0, 0)
    again = PromptCachePool(cache, budget=GiB, store=DiskStore(tmp_path, "tiny", "fp-1", GiB))
    assert again.ram_bytes == 0                    # indexed, nothing mapped yet
    found = again.lookup(prompt + [5], 700)
    assert found.n == 700 and all(b.mapped for b in found.blocks)
    again.restore(1, found)
    for got, want in zip(rows(tiny, 1, 700), expected):
        np.testing.assert_array_equal(got, want)


def test_a_file_of_other_settings_is_never_used_and_stale_folders_go(tiny, tmp_path):
    cache = tiny.transformer.cache
    prefill(tiny, 0, ids(50, 300))
    PromptCachePool(cache, GiB, DiskStore(tmp_path, "tiny", "fp-old", GiB)).close()
    old = tmp_path / "tiny" / "fp-old"
    assert list(old.glob("*" + SUFFIX))
    # a foreign file copied into the new folder: its header names the old fingerprint
    new = DiskStore(tmp_path, "tiny", "fp-new", GiB)
    assert not old.exists()                        # another version's folder: stale, removed
    prefill(tiny, 1, ids(50, 300))
    src = PromptCachePool(cache, GiB, DiskStore(tmp_path, "other", "fp-old", GiB))
    src.save(1)
    src.spill()
    foreign = next((tmp_path / "other" / "fp-old").glob("*" + SUFFIX))
    (new.folder / foreign.name).write_bytes(foreign.read_bytes())
    pool = PromptCachePool(cache, GiB, DiskStore(tmp_path, "tiny", "fp-new", GiB))
    assert len(pool) == 0 and not (new.folder / foreign.name).exists()


@pytest.mark.parametrize("damage", ["truncate", "magic", "keys"])
def test_a_corrupt_file_is_ignored_with_a_log_line(tiny, tmp_path, caplog, damage):
    cache = tiny.transformer.cache
    prompt = ids(60, 2 * BLOCK)
    prefill(tiny, 0, prompt)
    PromptCachePool(cache, GiB, DiskStore(tmp_path, "tiny", "fp", GiB)).close()
    first = next(p for p in (tmp_path / "tiny" / "fp").glob("*" + SUFFIX)
                 if b'"parent": ""' in p.read_bytes()[:8192])
    data = bytearray(first.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "magic":
        data[:4] = b"XXXX"
    else:  # a key changed: its name no longer is its keys' chain hash
        at = data.index(b'"keys": [') + len(b'"keys": [')
        data[at:at + 1] = b"9" if data[at:at + 1] != b"9" else b"8"
    first.write_bytes(bytes(data))
    cache.truncate(0, 0)
    with caplog.at_level("WARNING", logger="modelyard.prompt_cache"):
        pool = PromptCachePool(cache, GiB, DiskStore(tmp_path, "tiny", "fp", GiB))
        found = pool.lookup(prompt, 2 * BLOCK)
    assert found.n == 0
    assert not first.exists()
    assert any("ignoring" in r.getMessage() for r in caplog.records)


CRASH = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from engine.prompt_cache import disk
    def stop(*a, **k):
        os.kill(os.getpid(), 9)          # killed between the write and the rename
    disk.os.replace = stop
    disk.write_atomic(Path(sys.argv[1]), [b"x" * 1000])
""")


def test_a_crash_mid_write_leaves_nothing_that_is_read_back(tiny, tmp_path):
    cache = tiny.transformer.cache
    store = DiskStore(tmp_path, "tiny", "fp", GiB)
    target = store.folder / ("00" * 16 + SUFFIX)
    proc = subprocess.run([sys.executable, "-c", CRASH, str(target)], cwd=Path(__file__).parents[2],
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert proc.returncode == -signal.SIGKILL
    assert not target.exists() and list(store.folder.glob(".tmp-*"))
    pool = PromptCachePool(cache, GiB, DiskStore(tmp_path, "tiny", "fp", GiB))
    assert len(pool) == 0 and not list(store.folder.glob(".tmp-*"))  # the leftover is removed


def test_the_disk_budget_removes_the_least_recently_used_files(tiny, tmp_path):
    cache = tiny.transformer.cache
    block_file = None
    for seed in (70, 71, 72):
        prefill(tiny, 0, ids(seed, BLOCK))
        pool = PromptCachePool(cache, GiB, DiskStore(tmp_path, "tiny", "fp", GiB))
        pool.save(0)
        pool.spill()
        block_file = block_file or next(iter(pool._blocks.values())).path
        os.utime(next(iter(pool._blocks.values())).path or "", (seed, seed))  # older first
    sizes = [p.stat().st_size for p in (tmp_path / "tiny" / "fp").glob("*" + SUFFIX)]
    assert len(sizes) == 3
    DiskStore(tmp_path, "tiny", "fp", budget=2 * sizes[0]).trim()
    left = list((tmp_path / "tiny" / "fp").glob("*" + SUFFIX))
    assert len(left) == 2 and block_file is not None and not Path(block_file).exists()


def test_rings_and_recurrent_state_are_not_pooled():
    with engine.load(SYNTH_DIR / "gemma3_d64_l6_swa8_q8_0.gguf", n_ctx=640, n_threads=2,
                     n_slots=1, flash_attn=False) as gemma:
        assert "ring" in (poolable(gemma.transformer.cache) or "")


def test_smollm2_greedy_after_a_pool_hit_equals_a_cold_prefill(smollm2_path):
    with engine.load(smollm2_path, n_ctx=1024, n_threads=2, n_slots=1) as model:
        pool = PromptCachePool(model.transformer.cache, budget=GiB)
        runner = BatchRunner(model, prompt_cache=pool)
        system = model.tokenizer.encode("You are a careful assistant. " * 120)[:600]
        first = Sequence(system + model.tokenizer.encode(" Name a color."), params=GREEDY,
                         max_tokens=2, stop_at_eog=False)
        runner.submit(first)
        run_all(runner)
        runner.submit(Sequence(model.tokenizer.encode("Unrelated text " * 30), params=GREEDY,
                               max_tokens=1, stop_at_eog=False))
        run_all(runner)                            # the one slot is overwritten
        prompt = system + model.tokenizer.encode(" Name a fruit.")
        hit = Sequence(prompt, params=GREEDY, max_tokens=8, stop_at_eog=False)
        runner.submit(hit)
        run_all(runner)
        assert hit.cached >= len(system) == 600
        model.transformer.cache.truncate(0, 0)
        assert hit.generated == alone(model, prompt, GREEDY, 8)


def test_q8_0_rows_and_image_keys_round_trip_through_a_file(tmp_path):
    """A quantized cache's uint8 rows and an image span's (content hash, row) keys come back
    from disk as they went in; a key of another image is another block."""
    path = write_tiny_llama(tmp_path / "tiny.gguf", qtype=Q.Q8_0, n_ctx_train=2048,
                            n_embd=128)  # head dim 32: a q8_0 block per row
    with engine.load(path, n_ctx=600, n_threads=2, n_slots=2, type_k="q8_0",
                     type_v="q8_0") as model:
        cache = model.transformer.cache
        assert cache.k[0].dtype == np.uint8
        tokens = ids(80, BLOCK + 10)
        prefill(model, 0, tokens)
        expected = rows(model, 0, BLOCK + 10)
        image = [("sha-of-an-image", i) for i in range(BLOCK)]
        cache.tokens[0] = [*image, *tokens[BLOCK:]]  # the same rows, keyed as an image's
        PromptCachePool(cache, GiB, DiskStore(tmp_path / "pc", "tiny", "fp", GiB)).close()
        cache.truncate(0, 0)
        pool = PromptCachePool(cache, GiB, DiskStore(tmp_path / "pc", "tiny", "fp", GiB))
        other = [("sha-of-another", i) for i in range(BLOCK)]
        assert pool.lookup([*other, *tokens[BLOCK:]], BLOCK + 10).n == 0
        found = pool.lookup([*image, *tokens[BLOCK:], 7], BLOCK + 10)
        assert found.n == BLOCK + 10
        pool.restore(1, found)
        assert cache.tokens[1] == [*image, *tokens[BLOCK:]]
        for got, want in zip(rows(model, 1, BLOCK + 10), expected):
            np.testing.assert_array_equal(got, want)


def test_a_hit_larger_than_what_the_budget_leaves_still_restores(tiny):
    """Saving the slot's old content before a hit must not drop the blocks being copied."""
    cache = tiny.transformer.cache
    block_bytes = sum(a[0, :, :BLOCK].nbytes for a in (*cache.k, *cache.v))
    pool = PromptCachePool(cache, budget=2 * block_bytes)
    wanted = ids(90, 2 * BLOCK)
    prefill(tiny, 0, wanted)
    expected = rows(tiny, 0, 2 * BLOCK)
    pool.save(0)
    prefill(tiny, 1, ids(91, 2 * BLOCK))           # slot 1 holds two other blocks
    reuse, found = pool.take(1, wanted + [5], 2 * BLOCK, 0)
    assert found.miss is None
    assert reuse == 2 * BLOCK and cache.tokens[1] == wanted
    for got, want in zip(rows(tiny, 1, 2 * BLOCK), expected):
        np.testing.assert_array_equal(got, want)
    assert pool.ram_bytes <= 2 * block_bytes
