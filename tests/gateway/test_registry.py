"""The registry with a recording loader: loads, eviction, waiting, idle unload, failures, apply."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Config, ModelEntry, ModelNotFoundError, RegistrySettings
from gateway.fleet.lifecycle import InvalidTransition, ModelState, advance
from gateway.fleet.registry import Lease, ModelLoadFailedError, Registry, RegistryBusyError
from gateway.local.served_model import load_served_model
from tests.support.fakes import MB, FakeModel, RecordingLoader, run, state


def make_config(tmp_path: Path, *names: str, pinned: tuple[str, ...] = (),
                idle: dict[str, float] | None = None, **registry: Any) -> Config:
    entries = [ModelEntry(model=tmp_path / f"{n}.gguf", aliases=[n], pinned=n in pinned,
                          idle_timeout=(idle or {}).get(n)) for n in names]
    return Config(models=entries, registry=RegistrySettings(**registry))


def make_registry(config: Config, loader: RecordingLoader) -> Registry:
    return Registry(config, loader=loader, estimator=loader.estimate)


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll the loop until `condition` holds (no timing assertion: just a generous bound)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------------------------ lifecycle

def test_lifecycle_allows_the_diagram_edges_and_nothing_else() -> None:
    S = ModelState
    assert advance(S.UNLOADED, S.LOADING) is S.LOADING
    assert advance(S.FAILED, S.LOADING) is S.LOADING
    assert advance(S.DRAINING, S.UNLOADED) is S.UNLOADED
    for bad in [(S.READY, S.LOADING), (S.UNLOADED, S.READY), (S.LOADING, S.UNLOADED),
                (S.DRAINING, S.READY)]:
        with pytest.raises(InvalidTransition):
            advance(*bad)


# ------------------------------------------------------------------------------------- serving

def test_start_estimates_the_first_entries_so_a_first_request_skips_it(tmp_path: Path) -> None:
    from gateway.fleet.registry.core import ESTIMATE_AHEAD

    names = [f"m{i}" for i in range(ESTIMATE_AHEAD + 2)]
    asked: list[str] = []
    loader = RecordingLoader()

    def estimator(entry: ModelEntry) -> int:
        asked.append(entry.name)
        return MB

    async def main() -> None:
        registry = Registry(make_config(tmp_path, *names), loader=loader, estimator=estimator)
        await registry.start()
        await until(lambda: len(asked) == ESTIMATE_AHEAD)
        assert asked == names[:ESTIMATE_AHEAD]          # in config order, and no further
        async with registry.lease("m0"):
            pass
        assert asked == names[:ESTIMATE_AHEAD]          # the request found its estimate
        async with registry.lease(names[-1]):
            pass
        assert asked == [*names[:ESTIMATE_AHEAD], names[-1]]  # past the first: on request
        await registry.close()

    run(main())


def test_a_request_during_starts_estimate_waits_for_it_instead_of_asking_again(
        tmp_path: Path) -> None:
    asked: list[str] = []
    gate = threading.Event()
    loader = RecordingLoader()

    def estimator(entry: ModelEntry) -> int:
        asked.append(entry.name)
        gate.wait(10)
        return MB

    async def main() -> None:
        registry = Registry(make_config(tmp_path, "a"), loader=loader, estimator=estimator)
        await registry.start()
        await until(lambda: asked == ["a"])             # start()'s estimate is under way
        request = asyncio.ensure_future(registry.acquire("a"))
        await asyncio.sleep(0.05)
        assert not request.done()
        gate.set()
        registry.release(await request)
        assert asked == ["a"] and loader.loads == ["a"]
        await registry.close()

    run(main())


def test_acquire_loads_once_and_leases_count_in_flight(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "a"), loader)
        await registry.start()
        lease = await registry.acquire("a")
        assert isinstance(lease.model, FakeModel) and lease.entry.name == "a" and lease.alias == "a"
        second = await registry.acquire(None)  # no model named: the first entry
        [row] = registry.snapshot()
        assert (row["state"], row["in_flight"], row["load_count"]) == ("ready", 2, 1)
        assert row["memory_bytes"] == MB
        registry.release(lease)
        registry.release(lease)  # idempotent
        assert registry.snapshot()[0]["in_flight"] == 1
        assert lease.held is None  # the lease no longer keeps the model alive
        with pytest.raises(RuntimeError, match="released"):
            _ = lease.model  # nor hands it out
        registry.release(second)
        assert registry.snapshot()[0]["in_flight"] == 0
        await registry.close()

    run(main())
    assert loader.loads == ["a"]
    assert loader.closed() == ["a"]  # close() unloads everything


def test_concurrent_acquires_for_an_unloaded_model_start_one_load(tmp_path: Path) -> None:
    loader = RecordingLoader()
    loader.gate = threading.Event()

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "a"), loader)
        tasks = [asyncio.create_task(registry.acquire("a")) for _ in range(6)]
        await until(lambda: state(registry, "a") == "loading")
        await asyncio.sleep(0.05)  # let every request reach the loading model
        loader.gate.set()
        leases = await asyncio.gather(*tasks)
        assert len({id(lease.model) for lease in leases}) == 1
        assert registry.snapshot()[0]["in_flight"] == 6
        for lease in leases:
            registry.release(lease)
        await registry.close()

    run(main())
    assert loader.loads == ["a"]


def test_unknown_alias_is_model_not_found(tmp_path: Path) -> None:
    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "a", "b"), RecordingLoader())
        with pytest.raises(ModelNotFoundError) as info:
            await registry.acquire("nope")
        assert info.value.alias == "nope" and info.value.available == ["a", "b"]

    run(main())


def test_lease_context_manager_releases_on_error(tmp_path: Path) -> None:
    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "a"), RecordingLoader())
        with pytest.raises(RuntimeError):
            async with registry.lease("a"):
                assert registry.snapshot()[0]["in_flight"] == 1
                raise RuntimeError("handler failed")
        assert registry.snapshot()[0]["in_flight"] == 0
        await registry.close()

    run(main())


# ------------------------------------------------------------------------------------ eviction

def test_lru_with_one_model_slot_swaps_models(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "a", "b", max_loaded_models=1), loader)
        async with registry.lease("a"):
            pass
        async with registry.lease("b"):
            assert (state(registry, "a"), state(registry, "b")) == ("unloaded", "ready")
            assert loader.closed() == ["a"]
        async with registry.lease("a"):
            assert (state(registry, "a"), state(registry, "b")) == ("ready", "unloaded")
        await registry.close()

    run(main())
    assert loader.loads == ["a", "b", "a"]


def test_evicts_the_least_recently_used_model(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "a", "b", "c", max_loaded_models=2),
                                 loader)
        for name in ("a", "b", "a"):  # b is now the least recently used
            async with registry.lease(name):
                pass
        async with registry.lease("c"):
            assert [state(registry, n) for n in "abc"] == ["ready", "unloaded", "ready"]
        await registry.close()

    run(main())


def test_memory_budget_evicts_to_make_room(tmp_path: Path) -> None:
    loader = RecordingLoader({"a": 60 * MB, "b": 60 * MB, "small": 10 * MB})

    async def main() -> None:
        config = make_config(tmp_path, "a", "b", "small", max_loaded_models=5,
                             memory_budget=100 * MB)
        registry = make_registry(config, loader)
        async with registry.lease("a"):
            pass
        async with registry.lease("small"):  # 70 MiB: fits beside a
            pass
        async with registry.lease("b"):  # 130 MiB would not fit: a (LRU) goes, small stays
            assert [state(registry, n) for n in ("a", "b", "small")] == \
                ["unloaded", "ready", "ready"]
        await registry.close()

    run(main())


def test_a_model_larger_than_the_budget_fails_clearly(tmp_path: Path) -> None:
    loader = RecordingLoader({"huge": 200 * MB})

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "huge", memory_budget=100 * MB), loader)
        with pytest.raises(ModelLoadFailedError) as info:
            await registry.acquire("huge")
        assert info.value.path == tmp_path / "huge.gguf"
        assert "memory_budget" in info.value.cause

    run(main())
    assert loader.loads == []


def test_no_eviction_while_in_flight_then_busy_after_load_timeout(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        config = make_config(tmp_path, "a", "b", max_loaded_models=1, load_timeout=0.3)
        registry = make_registry(config, loader)
        lease = await registry.acquire("a")
        with pytest.raises(RegistryBusyError) as info:
            await registry.acquire("b")
        assert info.value.retry_after > 0
        assert "a (1 in flight)" in str(info.value)
        assert state(registry, "a") == "ready" and loader.closed() == []
        registry.release(lease)
        # The 0.3 s above is for the busy answer only: unloading a (close, then a full gc pass)
        # can take longer than that when the machine is loaded, so the next load gets the default.
        registry.apply(make_config(tmp_path, "a", "b", max_loaded_models=1))
        async with registry.lease("b"):  # now a can go
            assert state(registry, "a") == "unloaded"
        await registry.close()

    run(main())


async def b_waiting_behind_a(tmp_path: Path, loader: RecordingLoader
                             ) -> tuple[Registry, Lease, asyncio.Task[Lease]]:
    """Room for one model: a request holds a, and one for b waits (a task) until a is free."""
    registry = make_registry(make_config(tmp_path, "a", "b", max_loaded_models=1), loader)
    lease = await registry.acquire("a")
    waiting = asyncio.create_task(registry.acquire("b"))
    await asyncio.sleep(0.05)
    return registry, lease, waiting


def test_a_waiting_request_proceeds_when_the_serving_model_finishes(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        registry, lease, waiting = await b_waiting_behind_a(tmp_path, loader)
        assert not waiting.done() and loader.loads == ["a"]
        registry.release(lease)
        lease_b = await waiting
        assert lease_b.entry.name == "b" and loader.closed() == ["a"]
        registry.release(lease_b)
        await registry.close()

    run(main())


def test_a_cancelled_waiting_request_leaves_nothing_behind(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        registry, lease, waiting = await b_waiting_behind_a(tmp_path, loader)
        waiting.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await waiting
        registry.release(lease)
        await asyncio.sleep(0.05)
        assert [(r["state"], r["in_flight"]) for r in registry.snapshot()] == \
            [("ready", 0), ("unloaded", 0)]
        await registry.close()

    run(main())
    assert loader.loads == ["a"]


def test_pinned_model_loads_at_start_and_is_never_evicted(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        config = make_config(tmp_path, "p", "a", "b", pinned=("p",), max_loaded_models=2)
        registry = make_registry(config, loader)
        await registry.start()
        assert loader.loads == ["p"] and state(registry, "p") == "ready"
        for name in ("a", "b", "a"):
            async with registry.lease(name):
                pass
        assert state(registry, "p") == "ready"
        assert "p" not in loader.closed()
        await registry.close()

    run(main())
    assert loader.loads == ["p", "a", "b", "a"]


# --------------------------------------------------------------------------------- idle unload

def test_idle_model_unloads_after_its_timeout(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        config = make_config(tmp_path, "a", "b", idle={"a": 1.0}, idle_timeout=0)
        registry = make_registry(config, loader)
        await registry.start()
        async with registry.lease("a"):
            pass
        async with registry.lease("b"):  # registry default 0: never idles
            pass
        await until(lambda: state(registry, "a") == "unloaded")
        assert loader.closed() == ["a"] and state(registry, "b") == "ready"
        assert registry.snapshot()[0]["memory_bytes"] == 0
        await registry.close()

    run(main())


def test_a_model_in_use_is_not_idle_unloaded(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "a", idle={"a": 0.05}), loader)
        await registry.start()
        lease = await registry.acquire("a")
        await asyncio.sleep(0.3)  # far past the timeout, but a request is running
        assert state(registry, "a") == "ready"
        registry.release(lease)  # the idle clock starts now
        await until(lambda: state(registry, "a") == "unloaded")
        await registry.close()

    run(main())


# ------------------------------------------------------------------------------------ failures

def test_failed_load_keeps_the_error_and_the_next_request_retries(tmp_path: Path) -> None:
    loader = RecordingLoader()
    loader.fail["bad"] = OSError("truncated tensor data")

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "bad", "good"), loader)
        with pytest.raises(ModelLoadFailedError) as info:
            await registry.acquire("bad")
        assert info.value.path == tmp_path / "bad.gguf"
        assert "truncated tensor data" in info.value.cause
        assert str(tmp_path / "bad.gguf") in str(info.value)
        row = registry.snapshot()[0]
        assert row["state"] == "failed" and "truncated tensor data" in row["last_error"]

        async with registry.lease("good") as lease:  # other models are unaffected
            assert lease.entry.name == "good"

        async with registry.lease("bad"):  # retried, and this time it loads
            assert state(registry, "bad") == "ready"
        await registry.close()

    run(main())
    assert loader.loads == ["bad", "good", "bad"]


def test_every_request_waiting_on_a_failing_load_gets_the_error(tmp_path: Path) -> None:
    loader = RecordingLoader()
    loader.fail["bad"] = ValueError("bad magic")
    loader.gate = threading.Event()

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "bad"), loader)
        tasks = [asyncio.create_task(registry.acquire("bad")) for _ in range(3)]
        await until(lambda: state(registry, "bad") == "loading")
        await asyncio.sleep(0.05)
        loader.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, ModelLoadFailedError) and "bad magic" in r.cause
                   for r in results)

    run(main())
    assert loader.loads == ["bad"]


def test_a_slow_load_gives_busy_after_load_timeout_and_keeps_loading(tmp_path: Path) -> None:
    loader = RecordingLoader()
    loader.gate = threading.Event()

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "a", load_timeout=0.2), loader)
        with pytest.raises(RegistryBusyError):
            await registry.acquire("a")
        assert state(registry, "a") == "loading"
        loader.gate.set()
        await until(lambda: state(registry, "a") == "ready")
        async with registry.lease("a"):
            pass
        await registry.close()

    run(main())
    assert loader.loads == ["a"]


def test_closed_registry_refuses_requests(tmp_path: Path) -> None:
    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "a"), RecordingLoader())
        await registry.start()
        await registry.close()
        with pytest.raises(RegistryBusyError):
            await registry.acquire("a")

    run(main())


# --------------------------------------------------------------------------------------- apply

def test_apply_keeps_unchanged_models_warm_and_drains_the_rest(tmp_path: Path) -> None:
    loader = RecordingLoader()

    async def main() -> None:
        registry = make_registry(make_config(tmp_path, "keep", "change", "drop",
                                             max_loaded_models=3), loader)
        await registry.start()
        for name in ("keep", "change", "drop"):
            async with registry.lease(name):
                pass
        running = await registry.acquire("drop")  # a request still running on "drop"

        old = registry.config.models
        new_config = Config(models=[
            old[0].model_copy(update={"aliases": ["keep", "kept-too"]}),
            old[1].model_copy(update={"n_ctx": 8192}),
            ModelEntry(model=tmp_path / "new.gguf", aliases=["new"]),
        ], registry=registry.config.registry)
        result = registry.apply(new_config)
        assert (result.kept, result.reloaded, result.added, result.removed) == \
            (["keep"], ["change"], ["new"], ["drop"])

        async with registry.lease("kept-too") as lease:  # same loaded object, new alias
            assert lease.model is loader.models[0]
        await until(lambda: loader.models[1].closed)   # old "change" drained and unloaded
        assert not loader.models[2].closed             # "drop" still serves its request
        with pytest.raises(ModelNotFoundError):
            await registry.acquire("drop")
        registry.release(running)
        await until(lambda: not any(r["retiring"] for r in registry.snapshot()))
        assert loader.models[2].closed
        async with registry.lease("change") as lease:  # reloads with the new settings
            assert lease.entry.n_ctx == 8192
        await registry.close()

    run(main())
    assert loader.loads == ["keep", "change", "drop", "change"]


# ------------------------------------------------------------------------- real model memory

def _rss_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.real_model
def test_unloading_a_real_model_gives_its_memory_back(smollm2_path: Path) -> None:
    config = Config(models=[ModelEntry(model=smollm2_path, aliases=["smollm2"], n_ctx=512)])
    samples: dict[str, int] = {}

    async def cycle(measure: bool) -> None:
        registry = Registry(config, loader=load_served_model)  # the server's loader and estimator
        if measure:
            samples["before"] = _rss_bytes()
        async with registry.lease("smollm2") as lease:
            engine_model = lease.model.model  # the served model's (its scheduler thread is idle)
            ids = engine_model.tokenizer.encode("The capital of France is")
            assert len(list(engine_model.generate(ids, max_tokens=4))) > 0  # touch the weights
            del engine_model  # a reference left here would keep the model's memory
            if measure:
                samples["loaded"] = _rss_bytes()
                samples["model"] = registry.snapshot()[0]["memory_bytes"]
        await registry.close()
        assert registry.snapshot()[0]["state"] == "unloaded"
        if measure:
            samples["after"] = _rss_bytes()

    async def main() -> None:
        for _ in range(2):  # one-time costs (imports, compiled kernels, caches) come first
            await cycle(measure=False)
        await cycle(measure=True)

    run(main())
    before, loaded, after = samples["before"], samples["loaded"], samples["after"]
    # The load is visible (the file is ~90 MB), so the comparison below means something.
    assert loaded - before > samples["model"] // 2, samples
    assert after <= before * 1.10, samples


class CachingModel(FakeModel):
    """A model whose memory includes a prompt cache it can give back (as ServedModel's pool)."""

    def __init__(self, entry: ModelEntry, memory_bytes: int, cache: int) -> None:
        super().__init__(entry, memory_bytes)
        self.cache = cache

    def shrink_prompt_cache(self, nbytes: int) -> int:
        take = min(nbytes, self.cache)
        self.cache -= take
        self.memory_bytes -= take
        return take


def test_prompt_caches_shrink_before_any_model_is_evicted(tmp_path: Path) -> None:
    loader = RecordingLoader({"a": 60 * MB, "b": 55 * MB, "c": 90 * MB})
    plain = loader.__call__

    def load(entry: ModelEntry) -> FakeModel:
        model = plain(entry)
        if entry.name == "a":  # 60 MiB, of which a 30 MiB prompt cache
            model = loader.models[-1] = CachingModel(entry, 60 * MB, 30 * MB)
        return model

    async def main() -> None:
        config = make_config(tmp_path, "a", "b", "c", max_loaded_models=5,
                             memory_budget=100 * MB)
        registry = Registry(config, loader=load, estimator=loader.estimate)
        async with registry.lease("a"):
            pass
        async with registry.lease("b"):                # 60 + 55: 15 MiB over the budget
            assert [state(registry, n) for n in ("a", "b")] == ["ready", "ready"]
        a_model = loader.models[0]
        assert isinstance(a_model, CachingModel) and a_model.cache == 15 * MB
        row = next(r for r in registry.snapshot() if "a" in r["aliases"])
        assert row["memory_bytes"] == 45 * MB
        async with registry.lease("c"):                # beyond every cache: models go too
            assert state(registry, "c") == "ready"
        assert a_model.cache == 0 and state(registry, "a") == "unloaded"
        await registry.close()

    run(main())
